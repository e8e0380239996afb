// diffusers' FluxTransformer2DModel (FLUX.1-dev / -schnell and any config.json of that class),
// written from docs/models.md, "Flux transformer". Every block is a plain sequence of
// fused-op calls; the checkpoint key is beside each weight where it is declared (flux_transformer.cpp).
// The forward runs through the plug points of models/forward_context.h: every block through the
// block hook (flat index: the num_layers double blocks, then the num_single_layers single blocks),
// every joint attention through the attention policy, in the context's activation dtype.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/forward_context.h"
#include "models/tensor_parallel_plan.h"
#include "models/layers.h"
#include "models/shared_embeddings.h"

namespace cubevec::models {

struct FluxConfig {
  int64_t patch_size = 1;
  int64_t in_channels = 64;
  int64_t out_channels = 64;
  int64_t num_layers = 19;         // double-stream blocks
  int64_t num_single_layers = 38;  // single-stream blocks
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

// What the Linears reading SiLU(temb) produce: every block's modulation and norm_out's. It depends
// only on the timestep, the guidance and the pooled text, so a pipeline may compute it for all of a
// run's steps at once (one GEMM per Linear with a row per step, in place of one GEMV per step) and
// hand each forward its rows.
struct FluxModulation {
  std::vector<Tensor> blocks;   // by flat block index: norm1.linear (double) or norm.linear (single): [rows, 6D] / [rows, 3D]
  std::vector<Tensor> context;  // by double block: norm1_context.linear [rows, 6D]
  Tensor out;                   // norm_out.linear [rows, 2D]
  int64_t rows() const { return out.defined() && out.dim() > 0 ? out.size(0) : 0; }
  // Rows [first, first + count) of every tensor, as views.
  FluxModulation slice(int64_t first, int64_t count) const;
};

// forward's arguments, named as diffusers' forward names them.
struct FluxInputs {
  Tensor hidden_states;          // [B, N_img, in_channels] packed latents
  Tensor encoder_hidden_states;  // [B, L_txt, joint_attention_dim]
  Tensor pooled_projections;     // [B, pooled_projection_dim]
  Tensor timestep;               // [B], sigma in [0, 1] (the model multiplies by 1000)
  Tensor img_ids;                // [N_img, 3] (or [B, N_img, 3]: batch 0 is used)
  Tensor txt_ids;                // [L_txt, 3]
  Tensor guidance;               // [B] or undefined (needed iff guidance_embeds)
  // This forward's modulation ([B] rows, from FluxTransformer2DModel::modulation), or null: the
  // forward computes it from timestep, guidance and pooled_projections (which are checked either way).
  std::shared_ptr<const FluxModulation> modulation;
};

// What every block of one forward shares.
struct FluxBlockInputs {
  Tensor silu_temb;                      // SiLU(temb) [B, D], the modulation Linears' input (undefined when given `modulation`)
  RopeTable rope;                        // [L_txt + N_img, head_dim], text rows first
  std::array<int64_t, 3> grid{1, 1, 1};  // the image tokens' grid (1, H/2, W/2) when img_ids say so
  std::shared_ptr<const FluxModulation> modulation{};  // precomputed: the blocks and norm_out read it instead
};

// Double-stream block (FluxTransformerBlock) under `transformer_blocks.N.`: state.hidden is the
// image stream [B, N_img, D], state.encoder the text stream [B, L_txt, D].
struct FluxDoubleBlock {
  Linear norm1, norm1_context;                   // norm1.linear, norm1_context.linear: D -> 6D
  Linear to_q, to_k, to_v, add_q, add_k, add_v;  // attn.to_q ..., attn.add_q_proj ...
  Vector1d norm_q, norm_k, norm_added_q, norm_added_k;
  Linear to_out, to_add_out;                            // attn.to_out.0, attn.to_add_out
  Linear ff_in, ff_out, ff_context_in, ff_context_out;  // ff.net.0.proj, ff.net.2, ff_context...
  int64_t head_dim = 0;
  int index = 0, blocks = 0;  // flat index among all blocks, and their count
  std::string prefix;         // "transformer_blocks.N"

  void declare(ParameterTable& table, int block_index, const FluxConfig& config);
  // The joint attention goes through ctx's attention policy.
  BlockState forward(const BlockState& in, const FluxBlockInputs& shared, const ForwardContext& ctx, const Stream& stream) const;
};

// Single-stream block (FluxSingleTransformerBlock) under `single_transformer_blocks.N.`: runs on
// [text; image] tokens. The state is kept as the two streams, views of one joint tensor, so a
// run of single blocks concatenates only once.
struct FluxSingleBlock {
  Linear norm, proj_mlp, proj_out, to_q, to_k, to_v;
  Vector1d norm_q, norm_k;
  int64_t head_dim = 0;
  int index = 0, blocks = 0;
  std::string prefix;  // "single_transformer_blocks.N"

  void declare(ParameterTable& table, int single_index, const FluxConfig& config);
  BlockState forward(const BlockState& in, const FluxBlockInputs& shared, const ForwardContext& ctx, const Stream& stream) const;
};

// The model's prologue: embedded inputs and what the blocks share.
struct FluxPrologue {
  BlockState state;  // x_embedder(hidden_states), context_embedder(encoder_hidden_states)
  FluxBlockInputs shared;
  Tensor temb;  // [B, D]: timestep + guidance + pooled-text embeddings (undefined with a precomputed modulation)
};

class FluxTransformer2DModel {
 public:
  explicit FluxTransformer2DModel(FluxConfig config);
  FluxTransformer2DModel(const FluxTransformer2DModel&) = delete;
  FluxTransformer2DModel& operator=(const FluxTransformer2DModel&) = delete;

  // A diffusers transformer directory (see models/component.h for which weight file is read);
  // weights converted to `dtype` (f32 or bf16) at load.
  static std::unique_ptr<FluxTransformer2DModel> load(const std::string& dir, DType dtype = DType::f32, const std::string& variant = "");

  const FluxConfig& config() const { return config_; }
  const ParameterTable& parameters() const { return table_; }
  ParameterTable& mutable_parameters() { return table_; }

  // The predicted velocity [B, N_img, out_channels] in ctx.activations. Checks every input's shape
  // against the config. prologue, every block through ctx's block hook, epilogue.
  Tensor forward(const FluxInputs& inputs, const Stream& stream, const ForwardContext& ctx = {}) const;

  // The pieces of forward, so a pipeline can shard or offload around the blocks.
  FluxPrologue prologue(const FluxInputs& inputs, const ForwardContext& ctx, const Stream& stream) const;
  int block_count() const { return static_cast<int>(double_blocks_.size() + single_blocks_.size()); }
  // The blocks' attention and MLP Linears (norm1 modulations, embedders and proj_out stay whole).
  TensorParallelPlan tensor_parallel_plan() const;
  BlockIdentity block_identity(int index) const;
  // Block `index` (double blocks first, then single blocks), without the hook.
  BlockState block(int index, const BlockState& in, const FluxBlockInputs& shared, const ForwardContext& ctx, const Stream& stream) const;
  Tensor epilogue(const BlockState& state, const FluxPrologue& prologue, const Stream& stream) const;

  // temb [B, D] = timestep + guidance + pooled-text embeddings, in `activations`.
  Tensor time_text_embedding(const Tensor& timestep, const Tensor& guidance, const Tensor& pooled, const Stream& stream,
                             DType activations = DType::f32) const;
  // Every modulation for these rows of timestep [R], guidance [R] (if guidance_embeds) and pooled
  // [R, pooled_projection_dim]: the same values, row for row, as forwards of those rows compute.
  FluxModulation modulation(const Tensor& timestep, const Tensor& guidance, const Tensor& pooled, const Stream& stream,
                            DType activations = DType::f32) const;
  // Whether every Linear that modulation() runs is the plain float GEMM (none quantized or sharded):
  // only then are its rows independent of the step they are computed at.
  bool modulation_is_plain() const;
  const RopeCache& rope_cache() const { return rope_cache_; }

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
  RopeCache rope_cache_;
};

// 2x2 latent packing (docs/models.md "Flux latent packing"): [B, C, H, W] -> [B, (H/2)(W/2), 4C],
// and back.
Tensor pack_latents(const Tensor& latents, const Stream& stream);
Tensor unpack_latents(const Tensor& packed, int64_t height, int64_t width, const Stream& stream);
// img_ids [(H/2)(W/2), 3]: (0, row, col) for a latent of height x width.
Tensor flux_image_ids(int64_t latent_height, int64_t latent_width);

}  // namespace cubevec::models
