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

// What a denoiser keeps of prepare's run: the timesteps and activations, and whether a forward's
// step is one of them (a step outside it computes its own inputs).
class PreparedRun {
 public:
  void set(const std::vector<float>& timesteps, DType activations) {
    timesteps_ = timesteps;
    activations_ = activations;
  }
  DType activations() const { return activations_; }
  // Whether ctx's step is step ctx.step.index of the run, with the same timestep and activations.
  bool covers(const models::ForwardContext& ctx) const {
    const auto index = static_cast<std::size_t>(ctx.step.index);
    return !timesteps_.empty() && ctx.activations == activations_ && ctx.step.index >= 0 && index < timesteps_.size() &&
           timesteps_[index] == ctx.step.timestep;
  }
  // The timesteps as table rows: each step's `value(t)` `batch` times, step after step.
  template <class Value>
  Tensor rows(int64_t batch, Value value) const {
    std::vector<float> out;
    for (const float t : timesteps_) out.insert(out.end(), static_cast<std::size_t>(batch), value(t));
    return Tensor::from_vector(out, {static_cast<int64_t>(out.size())});
  }
  int64_t steps() const { return static_cast<int64_t>(timesteps_.size()); }

 private:
  std::vector<float> timesteps_;  // empty: prepare did not run (or refused)
  DType activations_ = DType::f32;
};

}  // namespace cubevec::pipelines
