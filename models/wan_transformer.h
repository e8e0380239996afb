// diffusers' WanTransformer3DModel (Wan2.1 text-to-video, 1.3B and 14B; image-to-video and
// first-last-frame with the image branch; any config.json of that class), written from
// docs/models.md, "Wan transformer" and "Wan image-to-video".
// Each block is a plain sequence of the fused ops Flux uses (layernorm_scale_shift, linear with
// fused epilogues, rms_norm, interleaved RoPE, attention_forward); the checkpoint key is beside
// each weight where it is declared (wan_transformer.cpp).
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/forward_context.h"
#include "models/tensor_parallel_plan.h"
#include "models/layers.h"
#include "models/shared_embeddings.h"

namespace cubevec::models {

struct WanConfig {
  std::array<int64_t, 3> patch_size{1, 2, 2};  // (t, h, w)
  int64_t num_attention_heads = 40;
  int64_t attention_head_dim = 128;
  int64_t in_channels = 16;
  int64_t out_channels = 16;
  int64_t text_dim = 4096;
  int64_t freq_dim = 256;
  int64_t ffn_dim = 13824;
  int64_t num_layers = 40;
  bool cross_attn_norm = true;
  double eps = 1e-6;
  int64_t rope_max_seq_len = 1024;
  // The image branch (Wan2.1 I2V / FLF2V; 0 = none, diffusers' null): the image encoder's width,
  // the cross-attention's added key/value input width, and FLF2V's learned position table length.
  int64_t image_dim = 0;
  int64_t added_kv_proj_dim = 0;
  int64_t pos_embed_seq_len = 0;

  bool has_image_branch() const { return image_dim > 0; }

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  // The head dim's RoPE split [t | h | w]: h = w = 2 floor(head_dim / 6), t the rest (44, 42, 42).
  std::array<int64_t, 3> rope_axes() const;

  // From a diffusers transformer/config.json. Keys starting with '_' are ignored; image_dim and
  // added_kv_proj_dim are both null or both set (the image branch); qk_norm must be
  // "rms_norm_across_heads"; unknown keys and wrong types are errors naming `source` and the key.
  static WanConfig from_json(const nlohmann::json& json, const std::string& source);
  static WanConfig load(const std::string& config_path);
  static WanConfig wan21_1_3b();  // 30 blocks, 1536 wide, 12 heads, ffn 8960
  static WanConfig wan21_14b();   // 40 blocks, 5120 wide, 40 heads, ffn 13824
  static WanConfig wan22_5b();    // TI2V-5B: 30 blocks, 3072 wide, 24 heads, ffn 14336, 48 channels in and out
};

// forward's arguments, named as diffusers' forward names them.
struct WanInputs {
  Tensor hidden_states;  // [B, in_channels, T, H, W] latents
  // [B], raw scheduler timesteps in [0, 1000] (not divided by 1000), or [B, L] one per token
  // (L = T' H' W' patches; Wan2.2 TI2V's expand_timesteps: the first frame's tokens at 0).
  Tensor timestep;
  Tensor encoder_hidden_states;  // [B, L_txt, text_dim] (umT5 states, zero-padded)
  // The image branch only: the image encoder's penultimate states [B, L_img, image_dim]; with
  // pos_embed_seq_len P (FLF2V), B x L_img = batch x P rows, e.g. diffusers' [2B, P / 2, image_dim]
  // (the first and the last picture), taken as [B, P, image_dim].
  Tensor encoder_hidden_states_image{};
  // Optional, computed ahead by this model: time_embedding of these rows (a pipeline computes all
  // steps' at once), text_embedding and image_embedding of the prompt (which no step changes). When
  // defined, the forward uses them in place of its own; the raw inputs are checked either way.
  Tensor temb{}, timestep_proj{};     // [B, D], [B, 6, D]; not with per-token timesteps
  Tensor context{}, image_context{};  // [B, L_txt, D], [B, L_img, D]
};

// The RoPE table [T' H' W', head_dim] of a patch grid: token (f, i, j), (t, h, w) row-major, gets
// angles f w_t | i w_h | j w_w (theta 10000), each repeated twice (the interleaved layout).
RopeTable wan_rope(int64_t frames, int64_t height, int64_t width, const WanConfig& config);

// Per-token timesteps, kept by their distinct values (TI2V has two: 0 and t): each value's
// embeddings once, and where it applies, instead of diffusers' [B, L, 6, D] of copies.
struct WanTokenTimesteps {
  Tensor temb;                // [U, D]: the time embedder's output per distinct value
  Tensor timestep_proj;       // [U, 6, D]
  std::vector<Tensor> masks;  // U masks [B, L, 1] f32: 1 where the token has value u
  bool defined() const { return !masks.empty(); }
  // sum_u masks[u] rows[u]: rows [U, D] f32 -> [B, L, D] f32.
  Tensor per_token(const Tensor& rows, const Stream& stream) const;
};

// What every block of one forward shares.
struct WanBlockInputs {
  Tensor context;                        // the projected text [B, L_txt, D]
  Tensor timestep_proj;                  // [B, 6, D]
  RopeTable rope;                        // [T' H' W', head_dim]
  std::array<int64_t, 3> grid{1, 1, 1};  // the patch grid (T', H', W')
  Tensor image_context{};                // the embedded image tokens [B, L_img, D] (the image branch only)
  WanTokenTimesteps tokens{};            // per-token timesteps (then timestep_proj is unused)
};

// One WanTransformerBlock under `blocks.N.`: self-attention with RoPE, cross-attention to the text,
// feed-forward; modulated by scale_shift_table + the timestep projection. Both attentions go
// through ctx's attention policy (`blocks.N.attn1`, self; `blocks.N.attn2`, cross).
struct WanBlock {
  Tensor scale_shift_table;                     // [1, 6, D]: shift, scale, gate (self-attention), shift, scale, gate (FFN)
  Linear to_q, to_k, to_v, to_out;              // attn1.to_q ..., attn1.to_out.0
  Vector1d norm_q, norm_k;                      // attn1.norm_q, norm_k: RMSNorm over all D channels
  Vector1d norm2_weight, norm2_bias;            // norm2: the cross-attention's affine LayerNorm
  Linear cross_q, cross_k, cross_v, cross_out;  // attn2.*
  Vector1d cross_norm_q, cross_norm_k;
  Linear add_k, add_v;    // attn2.add_k_proj, add_v_proj: the image tokens' key and value (image branch)
  Vector1d norm_added_k;  // attn2.norm_added_k
  bool image_branch = false;
  Linear ffn_in, ffn_out;  // ffn.net.0.proj, ffn.net.2
  int64_t head_dim = 0;
  float eps = 1e-6f;
  bool cross_attn_norm = true;
  int index = 0, blocks = 0;
  std::string prefix;  // "blocks.N"

  void declare(ParameterTable& table, int block_index, const WanConfig& config);
  // state.hidden: the video tokens [B, L, D]; returns the new state.
  BlockState forward(const BlockState& in, const WanBlockInputs& shared, const ForwardContext& ctx, const Stream& stream) const;
  // One cross-attention of `query` (the normed state's heads, made on first use) to `tokens` (the
  // text, or the image tokens) through the key / value projections k, v, as module prefix + `module`.
  Tensor attend_cross(const std::function<Tensor()>& query, const Tensor& tokens, const Linear& k, const Linear& v, const Vector1d& k_norm,
                      const std::string& module, const WanBlockInputs& shared, const ForwardContext& ctx, const Stream& stream) const;
};

struct WanPrologue {
  BlockState state;  // the patch-embedded video tokens [B, L, D]
  WanBlockInputs shared;
  Tensor temb;                                // [B, D] (the head's modulation input; per-token: shared.tokens.temb)
  int64_t frames = 0, height = 0, width = 0;  // latent size
};

class WanTransformer3DModel {
 public:
  explicit WanTransformer3DModel(WanConfig config);
  WanTransformer3DModel(const WanTransformer3DModel&) = delete;
  WanTransformer3DModel& operator=(const WanTransformer3DModel&) = delete;

  // A diffusers transformer directory (models/component.h), weights converted to `dtype` (f32 or
  // bf16; scale_shift_table and the time embedder stay f32 as diffusers' _keep_in_fp32_modules).
  static std::unique_ptr<WanTransformer3DModel> load(const std::string& dir, DType dtype = DType::f32, const std::string& variant = "");

  const WanConfig& config() const { return config_; }
  const ParameterTable& parameters() const { return table_; }
  ParameterTable& mutable_parameters() { return table_; }
  const std::vector<WanBlock>& blocks() const { return blocks_; }

  // The predicted flow [B, out_channels, T, H, W] in ctx.activations. Checks every input's shape
  // against the config. prologue, every block through ctx's block hook, epilogue.
  Tensor forward(const WanInputs& inputs, const Stream& stream, const ForwardContext& ctx = {}) const;

  WanPrologue prologue(const WanInputs& inputs, const ForwardContext& ctx, const Stream& stream) const;
  int block_count() const { return static_cast<int>(blocks_.size()); }
  // The blocks' attention and FFN Linears and the q / k RMSNorm weights over all heads.
  TensorParallelPlan tensor_parallel_plan() const;
  BlockIdentity block_identity(int index) const;
  // Which of its pipeline's transformers this is (BlockIdentity::model): 1 for a second expert.
  void set_model_index(int model) { model_index_ = model; }
  BlockState block(int index, const BlockState& in, const WanBlockInputs& shared, const ForwardContext& ctx, const Stream& stream) const;
  Tensor epilogue(const BlockState& state, const WanPrologue& prologue, const Stream& stream) const;

  // The pieces of the prologue:
  // temb [B, D] = time_embedder(sinusoid(timestep)); timestep_proj [B, 6, D] = time_proj(SiLU(temb)),
  // temb in f32 and cast to `activations` as diffusers does (its time embedder stays f32).
  std::pair<Tensor, Tensor> time_embedding(const Tensor& timestep, const Stream& stream, DType activations = DType::f32) const;
  // Per-token timesteps [B, L]: each distinct value's temb and timestep_proj, and its token mask.
  WanTokenTimesteps token_timesteps(const Tensor& timestep, const Stream& stream, DType activations = DType::f32) const;
  Tensor text_embedding(const Tensor& encoder_hidden_states, const Stream& stream, DType activations = DType::f32) const;  // [B, L_txt, D]
  // condition_embedder.image_embedder: [B, L_img, image_dim] (+ pos_embed) -> LayerNorm, GELU MLP,
  // LayerNorm -> [B, L_img, D]; the norms in f32 (FP32LayerNorm, eps 1e-5).
  Tensor image_embedding(const Tensor& image_states, const Stream& stream, DType activations = DType::f32) const;
  // Whether the Linears of time_embedding, text_embedding and image_embedding are all the plain
  // float GEMM (none quantized or sharded): only then may a pipeline compute them ahead of the steps.
  bool embedders_are_plain() const;
  Tensor patch_embed(const Tensor& hidden_states, const Stream& stream, DType activations = DType::f32) const;  // [B, L, D]
  // The output head and unpatchify: h [B, L, D], temb [B, D] -> [B, out_channels, T, H, W].
  // Per-token timesteps (`tokens` defined): each token's shift and scale from its value's temb.
  Tensor head(const Tensor& h, const Tensor& temb, int64_t frames, int64_t height, int64_t width, const Stream& stream,
              const WanTokenTimesteps* tokens = nullptr) const;
  const RopeCache& rope_cache() const { return rope_cache_; }

 private:
  WanConfig config_;
  ParameterTable table_;
  Tensor patch_weight_, patch_bias_;  // patch_embedding: Conv3d, kernel = stride = patch_size
  Linear time_1_, time_2_, time_proj_, text_1_, text_2_;
  Vector1d image_norm1_weight_, image_norm1_bias_, image_norm2_weight_, image_norm2_bias_;
  Linear image_ff_in_, image_ff_out_;
  Tensor image_pos_embed_;  // [1, pos_embed_seq_len, image_dim] (FLF2V)
  std::vector<WanBlock> blocks_;
  Tensor scale_shift_table_;  // [1, 2, D]: shift, scale of the output head
  Linear proj_out_;
  RopeCache rope_cache_;
  int model_index_ = 0;
};

}  // namespace cubevec::models
