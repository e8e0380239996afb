#include "models/clip_vision_model.h"

#include <algorithm>

#include "base/error.h"
#include "base/strict_json.h"
#include "models/component.h"
#include "models/transformers_config.h"
#include "ops/vector_ops.h"

namespace cubevec::models {

ClipVisionConfig ClipVisionConfig::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "CLIPVisionModel");
  expect_transformers_architecture(r, {"CLIPVisionModel", "CLIPVisionModelWithProjection"}, {"clip_vision_model"});
  ClipVisionConfig c;
  if (r.has("architectures")) {
    std::vector<std::string> listed;
    r.texts("architectures", listed);
    c.with_projection = std::find(listed.begin(), listed.end(), "CLIPVisionModel") == listed.end();
  }
  int64_t projection_dim = 0;  // the width of a CLIPVisionModelWithProjection's head, which is not run here
  r.integer("hidden_size", c.hidden_size, 1)
      .integer("intermediate_size", c.intermediate_size, 1)
      .integer("num_hidden_layers", c.num_hidden_layers, 1, 1024)
      .integer("num_attention_heads", c.num_attention_heads, 1, 1024)
      .integer("image_size", c.image_size, 1)
      .integer("patch_size", c.patch_size, 1)
      .integer("num_channels", c.num_channels, 3, 3)
      .positive_number("layer_norm_eps", c.layer_norm_eps)
      .text("hidden_act", c.hidden_act, {"quick_gelu", "gelu"})
      .integer("projection_dim", projection_dim, 1);
  if (c.hidden_size % c.num_attention_heads != 0)
    r.fail("hidden_size",
           std::to_string(c.hidden_size) + " is not a multiple of num_attention_heads " + std::to_string(c.num_attention_heads));
  if (c.patch_size > c.image_size)
    r.fail("patch_size", std::to_string(c.patch_size) + " is larger than image_size " + std::to_string(c.image_size));
  return c;
}

ClipVisionConfig ClipVisionConfig::load(const std::string& path) { return from_json(read_json_file(path), path); }

ClipVisionModel::ClipVisionModel(std::string source, ClipVisionConfig config, Stream stream)
    : source_(std::move(source)),
      config_(std::move(config)),
      stream_(std::move(stream)),
      layers_(static_cast<std::size_t>(config_.num_hidden_layers)) {
  const ClipVisionConfig& c = config_;
  const int64_t e = c.hidden_size;
  const std::string v = "vision_model.";
  table_.add(v + "embeddings.class_embedding", {e}, &class_embedding_);
  patch_embedding_.declare(table_, v + "embeddings.patch_embedding", c.num_channels, e, c.patch_size, c.patch_size, 0, false);
  // Added to the f32 embeddings: kept f32 when the model loads in bf16.
  table_.add(v + "embeddings.position_embedding.weight", {c.num_positions(), e}, &position_embedding_, /*keep_f32=*/true);
  pre_weight_.declare(table_, v + "pre_layrnorm.weight", e);
  pre_bias_.declare(table_, v + "pre_layrnorm.bias", e);
  for (std::size_t i = 0; i < layers_.size(); ++i)
    layers_[i].declare(table_, v + "encoder.layers." + std::to_string(i) + ".", e, c.intermediate_size);
  post_weight_.declare(table_, v + "post_layernorm.weight", e);
  post_bias_.declare(table_, v + "post_layernorm.bias", e);
}

std::unique_ptr<ClipVisionModel> ClipVisionModel::load(const std::string& dir, DType dtype, const Stream& stream) {
  ClipVisionConfig config = ClipVisionConfig::load(dir + "/config.json");
  const bool with_projection = config.with_projection;
  std::unique_ptr<ClipVisionModel> model(new ClipVisionModel(dir, std::move(config), stream));
  LoadOptions options;
  options.ignored_names = {"vision_model.embeddings.position_ids"};
  if (with_projection) options.ignored_names.push_back("visual_projection.weight");
  load_parameters(model->table_, open_component_weights(dir, "", "model"), dtype, options);
  return model;
}

std::unique_ptr<ClipVisionModel> ClipVisionModel::with_meta_weights(const ClipVisionConfig& config, DType dtype, const Stream& stream) {
  std::unique_ptr<ClipVisionModel> model(new ClipVisionModel("shape only", config, stream));
  make_meta_parameters(model->table_, dtype);
  return model;
}

std::pair<Tensor, Tensor> ClipVisionModel::encode(const Tensor& pixel_values, int64_t layers) const {
  const ClipVisionConfig& c = config_;
  const std::string where = "CLIPVisionModel.forward (" + source_ + ")";
  const std::string expected = "f32 [B, 3, " + std::to_string(c.image_size) + ", " + std::to_string(c.image_size) + "] with B >= 1";
  if (!pixel_values.defined()) throw Error(where + ": pixel_values is missing (expected " + expected + ")");
  if (pixel_values.dtype() != DType::f32 || pixel_values.dim() != 4 || pixel_values.size(0) < 1 || pixel_values.size(1) != c.num_channels ||
      pixel_values.size(2) != c.image_size || pixel_values.size(3) != c.image_size)
    throw Error(where + ": pixel_values must be " + expected + ", got " + std::string(dtype_name(pixel_values.dtype())) + " " +
                shape_to_string(pixel_values.shape()));
  const int64_t batch = pixel_values.size(0), e = c.hidden_size, g = c.patches_per_side();
  // The patches as tokens, row by row over the grid: [B, D, g, g] -> [B, g^2, D].
  const Tensor grid = patch_embedding_(pixel_values, stream_);
  const Tensor patches = ops::contiguous(grid.view({batch, e, g * g}).transpose(1, 2), stream_);
  const Tensor cls = class_embedding_.view({1, 1, e}).expand({batch, 1, e});
  const Tensor embeddings = ops::add(ops::concat({cls, patches}, 1, stream_), position_embedding_, stream_);
  ClipLayerSettings settings;
  settings.num_heads = c.num_attention_heads;
  settings.layer_norm_eps = static_cast<float>(c.layer_norm_eps);
  settings.activation = clip_activation(c.hidden_act);
  Tensor before, x = ops::fast_layernorm(embeddings, pre_weight_.value, pre_bias_.value, settings.layer_norm_eps,
                                         ops::LayerNormImpl::high_precision, stream_)
                         .out;
  for (int64_t i = 0; i < layers; ++i) {
    before = x;
    x = layers_[static_cast<std::size_t>(i)].forward(x, settings, stream_);
  }
  return {before, x};
}

ClipVisionModel::Output ClipVisionModel::forward(const Tensor& pixel_values) const {
  const auto [penultimate, last] = encode(pixel_values, config_.num_hidden_layers);
  const int64_t batch = last.size(0), e = config_.hidden_size;
  const Tensor cls = ops::contiguous(last.slice(1, 0, 1), stream_).view({batch, e});
  const Tensor pooled = ops::fast_layernorm(cls, post_weight_.value, post_bias_.value, static_cast<float>(config_.layer_norm_eps),
                                            ops::LayerNormImpl::high_precision, stream_)
                            .out;
  return {penultimate, last, pooled};
}

Tensor ClipVisionModel::penultimate_hidden_state(const Tensor& pixel_values) const {
  return encode(pixel_values, config_.num_hidden_layers - 1).second;
}

}  // namespace cubevec::models
