// transformers' CLIPTextModel (FLUX.1's text_encoder, CLIP-L): from a folder holding config.json
// and model.safetensors (or a sharded index), f32 or bf16. Forward for ids [L] (no padding mask,
// as FluxPipeline calls it):
//   x = token_embedding[ids] + position_embedding[0 .. L)                 (on the host)
//   per layer (pre-LN): x += out_proj(attention(q, k, v of LN1(x), causal, scale head_dim^-1/2))
//                       x += fc2(act(fc1(LN2(x))))        act: quick_gelu (x sigmoid(1.702 x)) or gelu
//                       (models/clip_encoder_layers.h, shared with CLIPVisionModel)
//   last_hidden_state = final_layer_norm(x)
//   pooler_output     = last_hidden_state at the end-of-text position, by transformers' rule:
//                       argmax(ids) when eos_token_id is 2 (the original openai configs, where
//                       <|endoftext|> = 49407 is the largest id), else the first id == eos_token_id
//                       (position 0 when there is none, as torch's argmax of all zeros).
// Activations are f32; a bf16 weight makes its GEMM round the inputs to bf16 (layers.h).
// Weight names: text_model.embeddings.{token,position}_embedding.weight,
// text_model.encoder.layers.i.{self_attn.{q,k,v,out}_proj, layer_norm1, layer_norm2, mlp.fc1,
// mlp.fc2}.{weight,bias}, text_model.final_layer_norm.{weight,bias}; the int64 buffer
// text_model.embeddings.position_ids of older checkpoints is ignored.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/stream.h"
#include "models/clip_encoder_layers.h"
#include "models/layers.h"

namespace cubevec::models {

struct ClipTextConfig {
  int64_t vocab_size = 49408;
  int64_t hidden_size = 512;
  int64_t intermediate_size = 2048;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 8;
  int64_t max_position_embeddings = 77;
  int64_t eos_token_id = 49407;
  double layer_norm_eps = 1e-5;
  std::string hidden_act = "quick_gelu";  // or "gelu"

  // transformers' defaults for absent keys; architectures must be CLIPTextModel (or
  // CLIPTextModelWithProjection), model_type clip_text_model.
  static ClipTextConfig from_json(const nlohmann::json& json, const std::string& source);
  static ClipTextConfig load(const std::string& path);
};

struct ClipTextOutput {
  Tensor last_hidden_state;  // f32 [1, L, hidden_size]
  Tensor pooler_output;      // f32 [1, hidden_size]
};

class ClipTextModel {
 public:
  // dir/config.json and dir's "model" weights; `dtype` f32 or bf16 (matrices stored so).
  static std::unique_ptr<ClipTextModel> load(const std::string& dir, DType dtype, const Stream& stream);
  // Shape-only weights (simulate mode, benchmarks) or random ones (benchmarks): no checkpoint.
  static std::unique_ptr<ClipTextModel> with_random_weights(const ClipTextConfig& config, DType dtype, const Stream& stream, uint64_t seed);
  static std::unique_ptr<ClipTextModel> with_meta_weights(const ClipTextConfig& config, DType dtype, const Stream& stream);

  // ids: 1 to max_position_embeddings token ids below vocab_size (else an Error).
  ClipTextOutput forward(const std::vector<int32_t>& ids) const;
  // The pooled position for `ids` by the rule above.
  int64_t eos_position(const std::vector<int32_t>& ids) const;

  const ClipTextConfig& config() const { return config_; }
  const ParameterTable& parameters() const { return table_; }
  const std::string& source() const { return source_; }

 private:
  ClipTextModel(std::string source, ClipTextConfig config, Stream stream);

  std::string source_;
  ClipTextConfig config_;
  Stream stream_;
  ParameterTable table_;
  Tensor token_embedding_, position_embedding_;
  std::vector<ClipEncoderLayer> layers_;  // sized once in the constructor: the table points into it
  Vector1d final_weight_, final_bias_;
};

}  // namespace cubevec::models
