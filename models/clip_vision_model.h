// transformers' CLIPVisionModel (Wan2.1 I2V's image_encoder, CLIP ViT-H/14): from a folder holding
// config.json and model.safetensors (or a sharded index), f32 or bf16. Forward for pixel_values
// f32 [B, num_channels = 3, image_size, image_size] (CLIPImageProcessor's output,
// models/clip_image_processor.h):
//   x = [class_embedding; patch_embedding(pixels)] + position_embedding      [B, 1 + g^2, D]
//       patch_embedding: Conv2d(3 -> D, kernel = stride = patch_size, no bias), g = image_size /
//       patch_size patches a side taken row by row
//   hidden_states[0] = pre_layrnorm(x)                                        (sic: transformers' name)
//   hidden_states[i] = encoder layer i - 1 of hidden_states[i - 1]            (models/clip_encoder_layers.h,
//                                                                              no attention mask)
//   penultimate_hidden_state = hidden_states[L - 1]: the output of layer L - 2 (hidden_states[-2],
//                              what diffusers' WanImageToVideoPipeline.encode_image takes)
//   last_hidden_state        = hidden_states[L]: the last layer's output, no final norm
//   pooler_output            = post_layernorm(last_hidden_state[:, 0])
// Activations are f32; a bf16 weight makes its GEMM round the inputs to bf16 (layers.h), and the
// patch convolution widens its bf16 kernel to f32.
// Weight names: vision_model.embeddings.{class_embedding, patch_embedding.weight,
// position_embedding.weight}, vision_model.pre_layrnorm.{weight,bias},
// vision_model.encoder.layers.<i>.*, vision_model.post_layernorm.{weight,bias}; the buffer
// vision_model.embeddings.position_ids of older checkpoints, and a CLIPVisionModelWithProjection's
// visual_projection.weight, are ignored.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/stream.h"
#include "models/clip_encoder_layers.h"
#include "models/layers.h"

namespace cubevec::models {

struct ClipVisionConfig {
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t image_size = 224;
  int64_t patch_size = 32;
  int64_t num_channels = 3;
  double layer_norm_eps = 1e-5;
  std::string hidden_act = "quick_gelu";  // or "gelu"
  bool with_projection = false;           // architectures names CLIPVisionModelWithProjection

  // transformers' CLIPVisionConfig defaults for absent keys (projection_dim is read and unused);
  // architectures must be CLIPVisionModel or CLIPVisionModelWithProjection, model_type
  // clip_vision_model; num_channels must be 3 and num_hidden_layers at least 1 (the penultimate
  // state needs two entries). Errors name `source` and the key.
  static ClipVisionConfig from_json(const nlohmann::json& json, const std::string& source);
  static ClipVisionConfig load(const std::string& path);

  int64_t patches_per_side() const { return image_size / patch_size; }
  int64_t num_positions() const { return patches_per_side() * patches_per_side() + 1; }  // the class token first
};

class ClipVisionModel {
 public:
  struct Output {
    Tensor penultimate_hidden_state;  // f32 [B, num_positions, hidden_size]
    Tensor last_hidden_state;         // f32 [B, num_positions, hidden_size]
    Tensor pooler_output;             // f32 [B, hidden_size]
  };

  // dir/config.json and dir's "model" weights; `dtype` f32 or bf16 (matrices stored so).
  static std::unique_ptr<ClipVisionModel> load(const std::string& dir, DType dtype, const Stream& stream);
  // Shape-only weights (simulate mode): no checkpoint.
  static std::unique_ptr<ClipVisionModel> with_meta_weights(const ClipVisionConfig& config, DType dtype, const Stream& stream);

  // pixel_values f32 [B, 3, image_size, image_size], B >= 1 (else an Error naming pixel_values and
  // the shape expected).
  Output forward(const Tensor& pixel_values) const;
  // Only hidden_states[-2], without running the last layer (what Wan's image conditioning needs).
  Tensor penultimate_hidden_state(const Tensor& pixel_values) const;

  const ClipVisionConfig& config() const { return config_; }
  const ParameterTable& parameters() const { return table_; }
  ParameterTable& mutable_parameters() { return table_; }
  const std::string& source() const { return source_; }

 private:
  ClipVisionModel(std::string source, ClipVisionConfig config, Stream stream);
  // hidden_states[0 .. layers] (pre_layrnorm output, then each layer's), only the last two kept:
  // {hidden_states[layers - 1], hidden_states[layers]}.
  std::pair<Tensor, Tensor> encode(const Tensor& pixel_values, int64_t layers) const;

  std::string source_;
  ClipVisionConfig config_;
  Stream stream_;
  ParameterTable table_;
  Tensor class_embedding_, position_embedding_;
  Conv2d patch_embedding_;
  Vector1d pre_weight_, pre_bias_, post_weight_, post_bias_;
  std::vector<ClipEncoderLayer> layers_;  // sized once in the constructor: the table points into it
};

}  // namespace cubevec::models
