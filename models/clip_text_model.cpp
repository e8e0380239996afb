#include "models/clip_text_model.h"

#include "models/component.h"
#include "models/transformers_config.h"
#include "ops/vector_ops.h"
#include "base/error.h"
#include "base/strict_json.h"

namespace cubevec::models {

ClipTextConfig ClipTextConfig::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "CLIPTextModel");
  expect_transformers_architecture(r, {"CLIPTextModel", "CLIPTextModelWithProjection"}, {"clip_text_model"});
  ClipTextConfig c;
  r.integer("vocab_size", c.vocab_size, 1)
      .integer("hidden_size", c.hidden_size, 1)
      .integer("intermediate_size", c.intermediate_size, 1)
      .integer("num_hidden_layers", c.num_hidden_layers, 0, 1024)
      .integer("num_attention_heads", c.num_attention_heads, 1, 1024)
      .integer("max_position_embeddings", c.max_position_embeddings, 1)
      .integer("eos_token_id", c.eos_token_id, 0)
      .positive_number("layer_norm_eps", c.layer_norm_eps)
      .text("hidden_act", c.hidden_act, {"quick_gelu", "gelu"});
  if (c.eos_token_id >= c.vocab_size)
    r.fail("eos_token_id", std::to_string(c.eos_token_id) + " is not below vocab_size " + std::to_string(c.vocab_size));
  if (c.hidden_size % c.num_attention_heads != 0)
    r.fail("hidden_size",
           std::to_string(c.hidden_size) + " is not a multiple of num_attention_heads " + std::to_string(c.num_attention_heads));
  return c;
}

ClipTextConfig ClipTextConfig::load(const std::string& path) { return from_json(read_json_file(path), path); }

ClipTextModel::ClipTextModel(std::string source, ClipTextConfig config, Stream stream)
    : source_(std::move(source)),
      config_(std::move(config)),
      stream_(std::move(stream)),
      layers_(static_cast<std::size_t>(config_.num_hidden_layers)) {
  const ClipTextConfig& c = config_;
  const int64_t e = c.hidden_size;
  table_.add("text_model.embeddings.token_embedding.weight", {c.vocab_size, e}, &token_embedding_);
  table_.add("text_model.embeddings.position_embedding.weight", {c.max_position_embeddings, e}, &position_embedding_);
  for (std::size_t i = 0; i < layers_.size(); ++i)
    layers_[i].declare(table_, "text_model.encoder.layers." + std::to_string(i) + ".", e, c.intermediate_size);
  final_weight_.declare(table_, "text_model.final_layer_norm.weight", e);
  final_bias_.declare(table_, "text_model.final_layer_norm.bias", e);
}

std::unique_ptr<ClipTextModel> ClipTextModel::load(const std::string& dir, DType dtype, const Stream& stream) {
  ClipTextConfig config = ClipTextConfig::load(dir + "/config.json");
  std::unique_ptr<ClipTextModel> model(new ClipTextModel(dir, std::move(config), stream));
  LoadOptions options;
  options.ignored_names = {"text_model.embeddings.position_ids"};
  load_parameters(model->table_, open_component_weights(dir, "", "model"), dtype, options);
  return model;
}

std::unique_ptr<ClipTextModel> ClipTextModel::with_random_weights(const ClipTextConfig& config, DType dtype, const Stream& stream,
                                                                  uint64_t seed) {
  std::unique_ptr<ClipTextModel> model(new ClipTextModel("random weights", config, stream));
  make_random_parameters(model->table_, dtype, seed);
  return model;
}

std::unique_ptr<ClipTextModel> ClipTextModel::with_meta_weights(const ClipTextConfig& config, DType dtype, const Stream& stream) {
  std::unique_ptr<ClipTextModel> model(new ClipTextModel("shape only", config, stream));
  make_meta_parameters(model->table_, dtype);
  return model;
}

int64_t ClipTextModel::eos_position(const std::vector<int32_t>& ids) const {
  int64_t best = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (config_.eos_token_id == 2) {
      if (ids[i] > ids[static_cast<std::size_t>(best)]) best = static_cast<int64_t>(i);  // the first maximum
    } else if (ids[i] == config_.eos_token_id) {
      return static_cast<int64_t>(i);
    }
  }
  return best;
}

ClipTextOutput ClipTextModel::forward(const std::vector<int32_t>& ids) const {
  const ClipTextConfig& c = config_;
  const auto length = static_cast<int64_t>(ids.size());
  if (length < 1 || length > c.max_position_embeddings)
    throw Error(source_ + ": " + std::to_string(length) + " token ids, expected 1 to " + std::to_string(c.max_position_embeddings) +
                " (max_position_embeddings)");
  const std::vector<int32_t> positions = [&] {
    std::vector<int32_t> p(ids.size());
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>(i);
    return p;
  }();
  Tensor x = ops::add(embedding_rows(token_embedding_, ids, source_), embedding_rows(position_embedding_, positions, source_), stream_);
  // The causal mask: query i sees keys 0 .. i.
  Tensor causal = Tensor::empty({length, length}, DType::boolean);
  auto* m = static_cast<uint8_t*>(causal.mutable_data_ptr());
  for (int64_t i = 0; i < length; ++i)
    for (int64_t j = 0; j < length; ++j) m[i * length + j] = j <= i ? 1 : 0;
  ClipLayerSettings settings;
  settings.num_heads = c.num_attention_heads;
  settings.layer_norm_eps = static_cast<float>(c.layer_norm_eps);
  settings.activation = clip_activation(c.hidden_act);
  settings.mask = causal;
  for (const ClipEncoderLayer& l : layers_) x = l.forward(x, settings, stream_);
  Tensor last =
      ops::fast_layernorm(x, final_weight_.value, final_bias_.value, settings.layer_norm_eps, ops::LayerNormImpl::high_precision, stream_)
          .out;
  const int64_t eos = eos_position(ids);
  Tensor pooled = ops::contiguous(last.slice(1, eos, eos + 1).reshape({1, c.hidden_size}), stream_);
  return {last, pooled};
}

}  // namespace cubevec::models
