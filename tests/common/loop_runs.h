// Denoising runs for tests that compare the loop's per-step path with what Denoiser::prepare
// computes ahead: StreamingStage changes nothing but says it streams the weights (as offload does),
// so with it the loop prepares nothing; run_denoising makes one run of a Flux or Wan pipeline on a
// fresh device and counts the kernels it launched.
#pragma once

#include <memory>
#include <string>

#include "device/device.h"
#include "pipelines/generation.h"
#include "pipelines/stage.h"

namespace cubevec::testing {

class StreamingStage : public pipelines::Stage {
 public:
  std::string name() const override { return "streaming"; }
  bool streams_weights() const override { return true; }
};

struct LoopRun {
  Tensor latents;
  uint64_t kernels = 0;
};

// `Pipeline`: FluxT2IPipeline or WanT2VPipeline, `Options` its options; `neg` null: CFG off.
template <class Pipeline, class Options>
LoopRun run_denoising(const Pipeline& pipeline, const Options& options, const models::PromptEmbeddings& pos,
                      const models::PromptEmbeddings* neg, bool streaming) {
  Device device(builtin_cpu_profile());
  pipelines::T2ITimings timings;
  pipelines::StageList stages;
  if (streaming) stages.add(std::make_unique<StreamingStage>());
  LoopRun run;
  run.latents = pipeline.denoise(pos, neg, options, device, {}, timings, &stages);
  run.kernels = device.stats().kernels;
  return run;
}

}  // namespace cubevec::testing
