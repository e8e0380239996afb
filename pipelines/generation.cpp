#include "pipelines/generation.h"

#include <cstdio>
#include <mutex>
#include <set>

#include "ops/vector_ops.h"
#include "base/error.h"
#include "tensor/finite_check.h"
#include "base/interrupt.h"

namespace cubevec::pipelines {

DenoiseTimer::DenoiseTimer(Device& device, T2ITimings& timings, StepCallback on_step)
    : device_(device),
      timings_(timings),
      on_step_(std::move(on_step)),
      start_(std::chrono::steady_clock::now()),
      modelled_start_(device.stats().modelled_makespan_s) {}

void DenoiseTimer::begin_step() {
  step_start_ = std::chrono::steady_clock::now();
  modelled_step_start_ = device_.stats().modelled_makespan_s;
}

void DenoiseTimer::end_step(int step, int steps, const Tensor& latents) {
  if (!device_.simulate()) latents.data_ptr();
  const double seconds = seconds_since(step_start_);
  timings_.step_s.push_back(seconds);
  timings_.modelled_step_s.push_back(device_.stats().modelled_makespan_s - modelled_step_start_);
  if (on_step_) on_step_(step, steps, seconds);
}

void DenoiseTimer::finish() {
  timings_.denoise_s = seconds_since(start_);
  timings_.modelled_denoise_s = device_.stats().modelled_makespan_s - modelled_start_;
}

Tensor round_to(const Tensor& x, DType dtype, const Stream& stream) {
  if (dtype == DType::f32) return x;
  return ops::cast(ops::cast(x, dtype, stream), DType::f32, stream);
}

Tensor run_denoising_loop(Denoiser& denoiser, Scheduler& scheduler, Guidance& guidance, StageList& stages, const Tensor& initial_latents,
                          const LoopOptions& options, Device& device, const StepCallback& on_step, T2ITimings& timings) {
  models::check_activation_dtype(options.activations);
  const Stream main = device.default_stream();
  const int steps = scheduler.steps();
  Tensor latents = round_to(ops::cast(initial_latents, DType::f32, main), options.activations, main);
  const RunInfo run{steps, options.blocks, guidance.branches(), device.simulate()};
  stages.begin_run(run);
  DenoiseTimer timer(device, timings, on_step);  // what prepare computes counts in the denoising time
  if (!stages.streams_weights()) denoiser.prepare(scheduler.timesteps(), options.activations, main);
  for (int i = 0; i < steps; ++i) {
    throw_if_interrupted();
    timer.begin_step();
    if (i == options.restart_stages_at) stages.restart(run);
    const models::StepInfo step{i, steps, scheduler.timesteps()[static_cast<std::size_t>(i)],
                                scheduler.sigmas()[static_cast<std::size_t>(i)], models::CfgBranch::cond};
    stages.before_step(step);
    const Tensor v = guidance.velocity(denoiser, latents, stages.context(step, options.activations), device);
    latents = scheduler.step(v, latents, main);
    if (options.after_step) latents = options.after_step(i, latents);
    latents = round_to(latents, options.activations, main);
    timer.end_step(i + 1, steps, latents);
    // A NaN or inf anywhere (a weight, an input, a setting) spreads to every pixel: stop at the
    // step it appears rather than write a black picture. end_step has synchronized the latents.
    if (!device.simulate())
      require_finite(latents, "denoising step " + std::to_string(i + 1) + " of " + std::to_string(steps) +
                                  " turned the latents non-finite (a weight, input or setting gives NaN or inf)");
  }
  timer.finish();
  return latents;
}

void print_notice_once(const std::string& text) {
  static std::mutex mutex;
  static std::set<std::string> printed;
  std::lock_guard lock(mutex);
  if (printed.insert(text).second) std::fprintf(stderr, "note: %s\n", text.c_str());
}

}  // namespace cubevec::pipelines
