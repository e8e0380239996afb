// A model as the denoising loop sees it: the velocity for the current latents, for one CFG branch
// or for both as one batch of 2. The Flux and Wan pipelines each adapt their transformer (input
// layout, text conditioning, how the timestep is passed) behind this interface.
#pragma once

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
  // Whether an unconditional branch (negative prompt) exists.
  virtual bool has_uncond() const = 0;
};

}  // namespace cubevec::pipelines
