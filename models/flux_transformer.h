// diffusers' FluxTransformer2DModel (FLUX.1-dev / -schnell and any config.json of that class),
// written from ../shared/reference/porting-spec.md section 1. Every block is a plain sequence of
// fused-op calls; the checkpoint key is beside each weight where it is declared (flux_transformer.cpp).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/layers.h"

namespace cubevec::models {

struct FluxConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 64;
  int64_t out_channels = 64;
  int64_t num_layers = 19;          // double-stream blocks
  int64_t num_single_layers = 38;   // single-stream blocks
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 4096;
  int64_t pooled_projection_dim = 768;
  bool guidance_embeds = false;
  std::vector<int64_t> axes_dims_rope{16, 56, 56};

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }

  // From a diffusers transformer/config.json (keys starting with '_' are ignored; unknown keys and
  // wrong types are errors naming `source` and the key). Defaults are diffusers' code defaults.
  static FluxConfig from_json(const nlohmann::json& json, const std::string& source);
  static FluxConfig load(const std::string& config_path);
  static FluxConfig flux1_dev();  // 19 + 38 blocks, 3072 wide, guidance-distilled
};

// The RoPE table for token ids [L, 3] (FluxPosEmbed, theta 10000): cos and sin [L, head_dim] f32,
// each axis' frequencies repeat-interleaved, computed in double.
struct RopeTable {
  Tensor cos, sin;
};
RopeTable flux_rope(const Tensor& ids, const std::vector<int64_t>& axes_dims, double theta = 10000.0);

// The sinusoidal embedding [B, channels] of diffusers' Timesteps(channels, flip_sin_to_cos=True,
// shift 0) of values [B] * multiplier (cosines first), computed in f32 as diffusers does. `values`
// is a host tensor (f32, bf16 or i64).
Tensor timestep_sinusoid(const Tensor& values, int64_t channels = 256, float multiplier = 1.0f);

// forward's arguments, named as diffusers' forward names them.
struct FluxInputs {
  Tensor hidden_states;          // [B, N_img, in_channels] packed latents
  Tensor encoder_hidden_states;  // [B, L_txt, joint_attention_dim]
  Tensor pooled_projections;     // [B, pooled_projection_dim]
  Tensor timestep;               // [B], sigma in [0, 1] (the model multiplies by 1000)
  Tensor img_ids;                // [N_img, 3] (or [B, N_img, 3]: batch 0 is used)
  Tensor txt_ids;                // [L_txt, 3]
  Tensor guidance;               // [B] or undefined (needed iff guidance_embeds)
};

// Double-stream block (FluxTransformerBlock) under `transformer_blocks.N.`.
struct FluxDoubleBlock {
  Linear norm1, norm1_context;                 // norm1.linear, norm1_context.linear: D -> 6D
  Linear to_q, to_k, to_v, add_q, add_k, add_v;  // attn.to_q ..., attn.add_q_proj ...
  Vector1d norm_q, norm_k, norm_added_q, norm_added_k;
  Linear to_out, to_add_out;                   // attn.to_out.0, attn.to_add_out
  Linear ff_in, ff_out, ff_context_in, ff_context_out;  // ff.net.0.proj, ff.net.2, ff_context...
  int64_t heads = 0, head_dim = 0;

  void declare(ParameterTable& table, const std::string& prefix, const FluxConfig& config);
  // h [B, N_img, D], c [B, L_txt, D], silu_temb [B, D]; returns the new (h, c).
  std::pair<Tensor, Tensor> forward(const Tensor& h, const Tensor& c, const Tensor& silu_temb, const RopeTable& rope,
                                    const Stream& stream) const;
};

// Single-stream block (FluxSingleTransformerBlock) under `single_transformer_blocks.N.`.
struct FluxSingleBlock {
  Linear norm, proj_mlp, proj_out, to_q, to_k, to_v;
  Vector1d norm_q, norm_k;
  int64_t heads = 0, head_dim = 0;

  void declare(ParameterTable& table, const std::string& prefix, const FluxConfig& config);
  // s = [text; image] tokens [B, L, D]; returns the new s.
  Tensor forward(const Tensor& s, const Tensor& silu_temb, const RopeTable& rope, const Stream& stream) const;
};

class FluxTransformer2DModel {
 public:
  explicit FluxTransformer2DModel(FluxConfig config);
  FluxTransformer2DModel(const FluxTransformer2DModel&) = delete;
  FluxTransformer2DModel& operator=(const FluxTransformer2DModel&) = delete;

  // A diffusers transformer directory: config.json + diffusion_pytorch_model.safetensors (or the
  // sharded index); weights converted to `dtype` (f32 or bf16) at load.
  static std::unique_ptr<FluxTransformer2DModel> load(const std::string& dir, DType dtype = DType::f32);

  const FluxConfig& config() const { return config_; }
  const ParameterTable& parameters() const { return table_; }

  // The predicted velocity [B, N_img, out_channels]. Checks every input's shape against the config.
  Tensor forward(const FluxInputs& inputs, const Stream& stream) const;
  // temb [B, D] = timestep + guidance + pooled-text embeddings.
  Tensor time_text_embedding(const Tensor& timestep, const Tensor& guidance, const Tensor& pooled,
                             const Stream& stream) const;

  const std::vector<FluxDoubleBlock>& double_blocks() const { return double_blocks_; }
  const std::vector<FluxSingleBlock>& single_blocks() const { return single_blocks_; }

 private:
  FluxConfig config_;
  ParameterTable table_;
  Linear x_embedder_, context_embedder_;
  Linear time_1_, time_2_, guidance_1_, guidance_2_, text_1_, text_2_;
  std::vector<FluxDoubleBlock> double_blocks_;
  std::vector<FluxSingleBlock> single_blocks_;
  Linear norm_out_, proj_out_;
};

// 2x2 latent packing (porting-spec 1.7): [B, C, H, W] -> [B, (H/2)(W/2), 4C], and back.
Tensor pack_latents(const Tensor& latents, const Stream& stream);
Tensor unpack_latents(const Tensor& packed, int64_t height, int64_t width, const Stream& stream);
// img_ids [(H/2)(W/2), 3]: (0, row, col) for a latent of height x width.
Tensor flux_image_ids(int64_t latent_height, int64_t latent_width);

}  // namespace cubevec::models
