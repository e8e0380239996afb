#include "models/t5_encoder.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <tbb/parallel_for.h>

#include "models/component.h"
#include "models/transformers_config.h"
#include "ops/attention.h"
#include "ops/vector_ops.h"
#include "base/error.h"
#include "tensor/half.h"
#include "base/strict_json.h"

namespace cubevec::models {

T5EncoderConfig T5EncoderConfig::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "T5EncoderModel");
  expect_transformers_architecture(r,
                                   {"T5EncoderModel", "T5ForConditionalGeneration", "T5Model", "UMT5EncoderModel",
                                    "UMT5ForConditionalGeneration", "UMT5Model", "MT5EncoderModel"},
                                   {"t5", "umt5", "mt5"});
  T5EncoderConfig c;
  std::string model_type = "t5";
  r.text("model_type", model_type);
  std::vector<std::string> architectures;
  if (r.has("architectures")) r.texts("architectures", architectures);
  c.umt5 = model_type == "umt5";
  for (const std::string& a : architectures) c.umt5 = c.umt5 || a.rfind("UMT5", 0) == 0;
  std::string ffn = "relu";
  r.integer("vocab_size", c.vocab_size, 1)
      .integer("d_model", c.d_model, 1)
      .integer("d_kv", c.d_kv, 1)
      .integer("d_ff", c.d_ff, 1)
      .integer("num_layers", c.num_layers, 0, 1024)
      .integer("num_heads", c.num_heads, 1, 1024)
      .integer("relative_attention_num_buckets", c.relative_attention_num_buckets, 4, 4096)
      .integer("relative_attention_max_distance", c.relative_attention_max_distance, 1)
      .positive_number("layer_norm_epsilon", c.layer_norm_epsilon)
      .text("feed_forward_proj", ffn, {"gated-gelu", "relu"});
  c.gated = ffn == "gated-gelu";
  // transformers derives these two from feed_forward_proj; a file that says otherwise asks for an
  // FFN cubevec would not run.
  std::string act = c.gated ? "gelu_new" : "relu";
  r.text("dense_act_fn", act, {"gelu_new", "relu"});
  if (act != (c.gated ? "gelu_new" : "relu"))
    r.fail("dense_act_fn",
           "'" + act + "' does not match feed_forward_proj '" + ffn + "' (expected '" + (c.gated ? "gelu_new" : "relu") + "')");
  bool gated_act = c.gated;
  r.boolean("is_gated_act", gated_act);
  if (gated_act != c.gated)
    r.fail("is_gated_act", std::string(gated_act ? "true" : "false") + " does not match feed_forward_proj '" + ffn + "'");
  if (c.relative_attention_max_distance <= c.relative_attention_num_buckets / 4)
    r.fail("relative_attention_max_distance", std::to_string(c.relative_attention_max_distance) +
                                                  " must exceed a quarter of relative_attention_num_buckets (" +
                                                  std::to_string(c.relative_attention_num_buckets / 4) + ")");
  return c;
}

T5EncoderConfig T5EncoderConfig::load(const std::string& path) { return from_json(read_json_file(path), path); }

int64_t t5_relative_position_bucket(int64_t relative_position, int64_t num_buckets, int64_t max_distance) {
  const int64_t half = num_buckets / 2;
  const int64_t base = relative_position > 0 ? half : 0;
  const int64_t n = std::llabs(relative_position);
  const int64_t max_exact = half / 2;
  if (n < max_exact) return base + n;
  // As transformers computes it: log in f32 of n / max_exact, divided by the Python float
  // log(max_distance / max_exact), times the logarithmic buckets, truncated.
  const float ratio = std::log(static_cast<float>(n) / static_cast<float>(max_exact));
  const auto log_range = static_cast<float>(std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  const float scaled = ratio / log_range * static_cast<float>(half - max_exact);
  return base + std::min<int64_t>(half - 1, max_exact + static_cast<int64_t>(scaled));
}

T5EncoderModel::T5EncoderModel(std::string source, T5EncoderConfig config, Stream stream, std::string embedding_name)
    : source_(std::move(source)),
      config_(std::move(config)),
      stream_(std::move(stream)),
      layers_(static_cast<std::size_t>(config_.num_layers)) {
  const T5EncoderConfig& c = config_;
  const int64_t d = c.d_model, inner = c.inner_dim();
  table_.add(embedding_name, {c.vocab_size, d}, &embedding_);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const std::string p = "encoder.block." + std::to_string(i) + ".layer.";
    Layer& l = layers_[i];
    l.q.declare(table_, p + "0.SelfAttention.q", d, inner, false);
    l.k.declare(table_, p + "0.SelfAttention.k", d, inner, false);
    l.v.declare(table_, p + "0.SelfAttention.v", d, inner, false);
    l.o.declare(table_, p + "0.SelfAttention.o", inner, d, false);
    if (c.umt5 || i == 0)
      table_.add(p + "0.SelfAttention.relative_attention_bias.weight", {c.relative_attention_num_buckets, c.num_heads},
                 &l.relative_attention_bias, true);
    l.ln0.declare(table_, p + "0.layer_norm.weight", d);
    l.ln1.declare(table_, p + "1.layer_norm.weight", d);
    if (c.gated) {
      l.wi_0.declare(table_, p + "1.DenseReluDense.wi_0", d, c.d_ff, false);
      l.wi_1.declare(table_, p + "1.DenseReluDense.wi_1", d, c.d_ff, false);
    } else {
      l.wi_0.declare(table_, p + "1.DenseReluDense.wi", d, c.d_ff, false);
    }
    l.wo.declare(table_, p + "1.DenseReluDense.wo", c.d_ff, d, false);
  }
  final_norm_.declare(table_, "encoder.final_layer_norm.weight", d);
}

std::unique_ptr<T5EncoderModel> T5EncoderModel::load(const std::string& dir, DType dtype, const Stream& stream) {
  T5EncoderConfig config = T5EncoderConfig::load(dir + "/config.json");
  const Checkpoint checkpoint = open_component_weights(dir, "", "model");
  // The tied embedding is saved under either name (or both).
  const std::string embedding = checkpoint.contains("encoder.embed_tokens.weight") ? "encoder.embed_tokens.weight" : "shared.weight";
  std::unique_ptr<T5EncoderModel> model(new T5EncoderModel(dir, std::move(config), stream, embedding));
  LoadOptions options;
  options.unexpected_prefixes = {"encoder."};  // decoder.*, lm_head.*, a second copy in shared.* are not ours
  load_parameters(model->table_, checkpoint, dtype, options);
  return model;
}

std::unique_ptr<T5EncoderModel> T5EncoderModel::with_random_weights(const T5EncoderConfig& config, DType dtype, const Stream& stream,
                                                                    uint64_t seed) {
  std::unique_ptr<T5EncoderModel> model(new T5EncoderModel("random weights", config, stream, "shared.weight"));
  make_random_parameters(model->table_, dtype, seed);
  return model;
}

std::unique_ptr<T5EncoderModel> T5EncoderModel::with_meta_weights(const T5EncoderConfig& config, DType dtype, const Stream& stream) {
  std::unique_ptr<T5EncoderModel> model(new T5EncoderModel("shape only", config, stream, "shared.weight"));
  make_meta_parameters(model->table_, dtype);
  return model;
}

// [1, heads, L, L] f32: the layer's table looked up by bucket, plus finfo(f32).min at padded keys
// (built on the host: a table lookup, L^2 x heads values).
Tensor T5EncoderModel::position_bias(const Layer& layer, int64_t length, const std::vector<int32_t>& mask) const {
  const T5EncoderConfig& c = config_;
  const Tensor& table = layer.relative_attention_bias;
  if (!table.has_storage()) return Tensor::meta({1, c.num_heads, length, length}, DType::f32);
  const float* weights = table.data<float>();  // kept f32 (declared keep_f32)
  std::vector<int64_t> bucket(static_cast<std::size_t>(2 * length - 1));
  for (int64_t r = -(length - 1); r < length; ++r)
    bucket[static_cast<std::size_t>(r + length - 1)] =
        t5_relative_position_bucket(r, c.relative_attention_num_buckets, c.relative_attention_max_distance);
  Tensor bias = Tensor::empty({1, c.num_heads, length, length}, DType::f32);
  float* out = bias.mutable_data<float>();
  const float lowest = std::numeric_limits<float>::lowest();
  // The bias depends on j - i only (plus the mask on j): per head, one diagonal-indexed row of
  // 2L - 1 values, of which row i is the slice starting at L - 1 - i. Heads in parallel.
  tbb::parallel_for(int64_t{0}, c.num_heads, [&](int64_t h) {
    std::vector<float> diagonal(bucket.size());
    for (std::size_t d = 0; d < bucket.size(); ++d) diagonal[d] = weights[bucket[d] * c.num_heads + h];
    for (int64_t i = 0; i < length; ++i) {
      float* row = out + (h * length + i) * length;
      std::copy_n(diagonal.data() + (length - 1 - i), length, row);
      if (!mask.empty())
        for (int64_t j = 0; j < length; ++j)
          if (mask[static_cast<std::size_t>(j)] == 0) row[j] += lowest;
    }
  });
  return bias;
}

Tensor T5EncoderModel::forward(const std::vector<int32_t>& ids, const std::vector<int32_t>& attention_mask) const {
  const T5EncoderConfig& c = config_;
  const auto length = static_cast<int64_t>(ids.size());
  if (length < 1) throw Error(source_ + ": no token ids to encode");
  if (!attention_mask.empty() && attention_mask.size() != ids.size())
    throw Error(source_ + ": attention_mask has " + std::to_string(attention_mask.size()) + " values for " + std::to_string(length) +
                " ids");
  for (int32_t m : attention_mask)
    if (m != 0 && m != 1) throw Error(source_ + ": attention_mask values must be 0 or 1, got " + std::to_string(m));
  Tensor x = !embedding_.has_storage() ? Tensor::meta({1, length, c.d_model}, DType::f32) : embedding_rows(embedding_, ids, source_);
  const auto eps = static_cast<float>(c.layer_norm_epsilon);
  ops::AttentionOptions attention;
  attention.layout = ops::AttentionLayout::bsh;
  attention.num_heads = c.num_heads;
  attention.scale = 1.0;  // T5 does not scale the scores (Mesh-TF folds it into q's weights)
  Tensor bias;
  for (const Layer& l : layers_) {
    if (l.relative_attention_bias.defined()) bias = position_bias(l, length, attention_mask);
    attention.mask = bias;
    const Tensor h = ops::rms_norm(x, l.ln0.value, eps, stream_);
    x = l.o(ops::attention_forward(l.q(h, stream_), l.k(h, stream_), l.v(h, stream_), attention, stream_), stream_, {.residual = x});
    const Tensor h2 = ops::rms_norm(x, l.ln1.value, eps, stream_);
    const Tensor inner = c.gated
                             ? ops::mul(l.wi_0(h2, stream_, {.activation = ops::GemmActivation::gelu_tanh}), l.wi_1(h2, stream_), stream_)
                             : ops::activation(l.wi_0(h2, stream_), ops::Activation::relu, stream_);
    x = l.wo(inner, stream_, {.residual = x});
  }
  return ops::rms_norm(x, final_norm_.value, eps, stream_);
}

}  // namespace cubevec::models
