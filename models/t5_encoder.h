// transformers' T5EncoderModel (FLUX.1's text_encoder_2, T5-v1.1-XXL) and UMT5EncoderModel (Wan's
// text_encoder, umT5-XXL), from a folder holding config.json and model.safetensors (or a sharded
// index), f32 or bf16. Forward for ids [L] and attention_mask [L] (1 = token, 0 = padding):
//   x = embedding[ids]                                       (not scaled; on the host)
//   bias[h, i, j] = relative_attention_bias[bucket(j - i), h] + (mask[j] ? 0 : finfo(f32).min)
//   per layer: x += o(attention(q, k, v of RMS_0(x), bias, no scaling of the scores))
//              x += wo(gelu_tanh(wi_0(RMS_1(x))) * wi_1(RMS_1(x)))     (gated-gelu; relu: wo(relu(wi(.))))
//   last_hidden_state = RMS_final(x)
// RMS(x) = w * x / sqrt(mean(x^2) + eps), no mean and no bias. T5 computes the bias once from
// layer 0's table and every layer reuses it; umT5 has a table per layer. bucket(): transformers'
// bidirectional relative position bucket (half the buckets for keys after the query, exact below
// num_buckets / 4, logarithmic up to max_distance). The bias reaches attention_forward as an f32
// attn_mask (ops/attention.h). Activations are f32; bf16 weights stay bf16 (layers.h).
// Weight names: shared.weight or encoder.embed_tokens.weight (tied; either), encoder.block.i.layer.0
// .SelfAttention.{q,k,v,o}.weight, ...relative_attention_bias.weight [num_buckets, heads] (block 0
// for T5, every block for umT5), encoder.block.i.layer.{0,1}.layer_norm.weight,
// encoder.block.i.layer.1.DenseReluDense.{wi_0,wi_1,wo}.weight (wi when not gated),
// encoder.final_layer_norm.weight. Decoder and lm_head tensors of a full checkpoint are ignored.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/stream.h"
#include "models/layers.h"

namespace cubevec::models {

struct T5EncoderConfig {
  bool umt5 = false;  // UMT5EncoderModel: a relative position bias per layer
  int64_t vocab_size = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;
  int64_t d_ff = 2048;
  int64_t num_layers = 6;
  int64_t num_heads = 8;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  bool gated = true;  // feed_forward_proj "gated-gelu" (true) or "relu" (false)

  // architectures T5EncoderModel / T5ForConditionalGeneration (model_type t5) or UMT5EncoderModel
  // (umt5); transformers' defaults for absent keys.
  static T5EncoderConfig from_json(const nlohmann::json& json, const std::string& source);
  static T5EncoderConfig load(const std::string& path);
  int64_t inner_dim() const { return num_heads * d_kv; }
};

// transformers' _relative_position_bucket(relative_position, bidirectional=True, ...).
int64_t t5_relative_position_bucket(int64_t relative_position, int64_t num_buckets, int64_t max_distance);

class T5EncoderModel {
 public:
  static std::unique_ptr<T5EncoderModel> load(const std::string& dir, DType dtype, const Stream& stream);
  static std::unique_ptr<T5EncoderModel> with_random_weights(const T5EncoderConfig& config, DType dtype, const Stream& stream,
                                                             uint64_t seed);
  static std::unique_ptr<T5EncoderModel> with_meta_weights(const T5EncoderConfig& config, DType dtype, const Stream& stream);

  // last_hidden_state f32 [1, L, d_model]. attention_mask: empty (every token attended, as
  // FluxPipeline calls T5) or L values of 0 / 1.
  Tensor forward(const std::vector<int32_t>& ids, const std::vector<int32_t>& attention_mask = {}) const;

  const T5EncoderConfig& config() const { return config_; }
  const ParameterTable& parameters() const { return table_; }
  const std::string& source() const { return source_; }
  std::string class_name() const { return config_.umt5 ? "UMT5EncoderModel" : "T5EncoderModel"; }

 private:
  struct Layer {
    Vector1d ln0, ln1;
    Linear q, k, v, o, wi_0, wi_1, wo;  // wi_0 is `wi` when not gated
    Tensor relative_attention_bias;     // [num_buckets, heads]; undefined for T5's layers after 0
  };
  T5EncoderModel(std::string source, T5EncoderConfig config, Stream stream, std::string embedding_name);
  Tensor position_bias(const Layer& layer, int64_t length, const std::vector<int32_t>& mask) const;

  std::string source_;
  T5EncoderConfig config_;
  Stream stream_;
  ParameterTable table_;
  Tensor embedding_;
  std::vector<Layer> layers_;
  Vector1d final_norm_;
};

}  // namespace cubevec::models
