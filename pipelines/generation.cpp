#include "pipelines/generation.h"

#include "tensor/enum_names.h"
#include "tensor/error.h"

namespace cubevec::pipelines {

namespace {
constexpr auto kCfgModeNames =
    enum_names<CfgMode>("CFG mode", {{CfgMode::off, "off"}, {CfgMode::fused, "fused"}, {CfgMode::streams, "streams"}});
}  // namespace

CfgMode parse_cfg_mode(std::string_view name) { return kCfgModeNames.parse(name); }

std::string_view cfg_mode_name(CfgMode mode) { return kCfgModeNames.name(mode); }

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
