#include "pipelines/generation.h"

#include "tensor/error.h"

namespace cubevec::pipelines {

CfgMode parse_cfg_mode(std::string_view name) {
  if (name == "off") return CfgMode::off;
  if (name == "fused") return CfgMode::fused;
  if (name == "streams") return CfgMode::streams;
  throw Error("unknown CFG mode '" + std::string(name) + "' (expected off, fused or streams)");
}

std::string_view cfg_mode_name(CfgMode mode) {
  switch (mode) {
    case CfgMode::off: return "off";
    case CfgMode::fused: return "fused";
    case CfgMode::streams: return "streams";
  }
  return "?";
}

DenoiseTimer::DenoiseTimer(Device& device, T2ITimings& timings, StepCallback on_step)
    : device_(device), timings_(timings), on_step_(std::move(on_step)), start_(std::chrono::steady_clock::now()),
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

}  // namespace cubevec::pipelines
