// The inputs the block benchmarks run on (suites `blocks` and `scaling`): one Flux block's at
// FLUX.1 width on 1024 image + 256 text tokens, one Wan block's on a 4,680-token video (13 latent
// frames of 18 x 20 patches) with 512 text tokens; random activations, fixed seeds.
#pragma once

#include "models/flux_transformer.h"
#include "models/wan_transformer.h"
#include "ops/vector_ops.h"

namespace cubevec::bench {

inline constexpr int64_t kFluxImageTokens = 1024, kFluxTextTokens = 256;
inline constexpr int64_t kWanFrames = 13, kWanHeight = 18, kWanWidth = 20, kWanTextTokens = 512;

struct FluxBlockInputsF32 {
  Tensor hidden, context_states, silu_temb;  // f32
  models::RopeTable rope;
};

inline FluxBlockInputsF32 flux_block_inputs(const models::FluxConfig& config, const Stream& s) {
  const int64_t d = config.inner_dim();
  models::ParameterTable table;
  Tensor hidden, context_states, temb;
  table.add("hidden", {1, kFluxImageTokens, d}, &hidden);
  table.add("context", {1, kFluxTextTokens, d}, &context_states);
  table.add("temb", {1, d}, &temb);
  models::make_random_parameters(table, DType::f32, 11, 1.0f);
  // Zero text ids and the 32 x 32 image grid.
  const models::RopeTable txt = models::axial_rope(Tensor::zeros({kFluxTextTokens, 3}, DType::f32), config.axes_dims_rope);
  const models::RopeTable img = models::axial_rope(models::flux_image_ids(64, 64), config.axes_dims_rope);
  return {hidden,
          context_states,
          ops::activation(temb, ops::Activation::silu, s),
          {ops::concat({txt.cos, img.cos}, 0, s), ops::concat({txt.sin, img.sin}, 0, s)}};
}

struct WanBlockInputsF32 {
  Tensor hidden, context_states, timestep_proj;  // f32
  models::RopeTable rope;
};

inline WanBlockInputsF32 wan_block_inputs(const models::WanConfig& config) {
  const int64_t d = config.inner_dim(), tokens = kWanFrames * kWanHeight * kWanWidth;
  models::ParameterTable table;
  Tensor hidden, context_states, timestep_proj;
  table.add("hidden", {1, tokens, d}, &hidden);
  table.add("context", {1, kWanTextTokens, d}, &context_states);
  table.add("timestep_proj", {1, 6, d}, &timestep_proj);
  models::make_random_parameters(table, DType::f32, 13, 1.0f);
  return {hidden, context_states, timestep_proj, models::wan_rope(kWanFrames, kWanHeight, kWanWidth, config)};
}

}  // namespace cubevec::bench
