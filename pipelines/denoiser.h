// A model as the denoising loop sees it: the velocity for the current latents, for one CFG branch
// or for both as one batch of 2. The Flux and Wan pipelines each adapt their transformer (input
// layout, text conditioning, how the timestep is passed) behind this interface.
#pragma once

#include <vector>

#include "models/forward_context.h"
#include "tensor/tensor.h"

namespace cubevec::pipelines {

class Denoiser {
 public:
  virtual ~Denoiser() = default;
  // latents: the loop's state, batch 1 (f32). ctx.step says the step and the branch: cond or uncond
  // give a batch-1 velocity, both a batch-2 one (conditional first). The result is in
  // ctx.activations.
  virtual Tensor predict(const Tensor& latents, const models::ForwardContext& ctx, const Stream& stream) = 0;
  // Before the first step: the run's timesteps (ctx.step.timestep of each step, in order) and its
  // activations. A denoiser may compute here, for all steps at once, what depends only on them and
  // the prompt (Flux: every block's modulation). Not called while a stage streams the weights.
  virtual void prepare(const std::vector<float>& /*timesteps*/, DType /*activations*/, const Stream& /*stream*/) {}
  // Whether an unconditional branch (negative prompt) exists.
  virtual bool has_uncond() const = 0;
};

}  // namespace cubevec::pipelines
