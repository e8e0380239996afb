// What every generation pipeline here (Flux t2i, Wan t2v) shares: how CFG runs, the timings it
// reports, and the timer of its denoising loop.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "device/device.h"
#include "tensor/tensor.h"

namespace cubevec::pipelines {

// How classifier-free guidance runs: off (one forward per step), fused (cond and uncond as one
// batch of 2), streams (cond and uncond forwards on two streams of the device, overlapping).
enum class CfgMode { off, fused, streams };
CfgMode parse_cfg_mode(std::string_view name);  // "off", "fused", "streams"
std::string_view cfg_mode_name(CfgMode mode);

struct T2ITimings {
  double denoise_s = 0, vae_s = 0;
  std::vector<double> step_s;     // measured per step
  double modelled_denoise_s = 0;  // on the device's modelled clock (the NPU in simulate mode)
  std::vector<double> modelled_step_s;
};

// Called after each denoising step: (step, steps, seconds this step took).
using StepCallback = std::function<void(int, int, double)>;

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

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

}  // namespace cubevec::pipelines
