// What every generation pipeline here (Flux t2i, Wan t2v) shares: the timings it reports and the
// one denoising loop (scheduler, guidance, stages) with its timer.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "device/device.h"
#include "pipelines/denoiser.h"
#include "pipelines/guidance.h"
#include "pipelines/scheduler.h"
#include "pipelines/seconds_since.h"
#include "pipelines/stage.h"
#include "tensor/tensor.h"

namespace cubevec::pipelines {

struct T2ITimings {
  double denoise_s = 0, vae_s = 0;
  double image_s = 0;             // encoding the input picture(s): image-to-video's condition and image tokens
  std::vector<double> step_s;     // measured per step
  double modelled_denoise_s = 0;  // on the device's modelled clock (the NPU in simulate mode)
  std::vector<double> modelled_step_s;
};

// Called after each denoising step: (step, steps, seconds this step took).
using StepCallback = std::function<void(int, int, double)>;

// Prints "note: <text>" on stderr the first time this process sees `text` (a model folder is
// read twice, for the estimate and for the weights: its notices should appear once).
void print_notice_once(const std::string& text);

// Times a denoising loop's steps on the wall clock and the device's modelled clock into `timings`
// and reports each step to `on_step`.
class DenoiseTimer {
 public:
  DenoiseTimer(Device& device, T2ITimings& timings, StepCallback on_step);
  void begin_step();
  // Waits for `latents` (unless simulating, so the step's time is real), records the step.
  void end_step(int step, int steps, const Tensor& latents);
  void finish();  // the loop's totals

 private:
  Device& device_;
  T2ITimings& timings_;
  StepCallback on_step_;
  std::chrono::steady_clock::time_point start_, step_start_;
  double modelled_start_ = 0, modelled_step_start_ = 0;
};

// The denoising loop every pipeline runs: from `initial_latents` (f32; rounded to `activations`
// first, as diffusers draws bf16 noise), for each of the scheduler's steps: the stages' step
// hooks, the guided velocity through `guidance` (every forward gets the stages' plug points), the
// scheduler's update, the latents rounded to `activations` again. Returns the final latents (f32).
struct LoopOptions {
  DType activations = DType::f32;
  int blocks = 0;  // the transformer's blocks per forward (for the stages)
  // Run on the latents after each scheduler step (before their rounding to `activations`), with
  // the step's index: inpainting puts the known region back there.
  std::function<Tensor(int, const Tensor&)> after_step{};
  // Before this step the stages start over as at the run's start (their step counts are kept): the
  // step where a second expert model takes over (Wan2.2 A14B). -1: never.
  int restart_stages_at = -1;
};
Tensor run_denoising_loop(Denoiser& denoiser, Scheduler& scheduler, Guidance& guidance, StageList& stages, const Tensor& initial_latents,
                          const LoopOptions& options, Device& device, const StepCallback& on_step, T2ITimings& timings);

// `x` (f32) with its values rounded to `dtype` (f32: unchanged; bf16: to nearest even).
Tensor round_to(const Tensor& x, DType dtype, const Stream& stream);

}  // namespace cubevec::pipelines
