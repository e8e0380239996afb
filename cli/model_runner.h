// A Flux or Wan model folder behind one interface, for the commands that run a model many times
// with stages (tune-cache, quantize): the transformer's class decides the pipeline, the text comes
// through cli/text_conditioning.h, and a run returns the final latents and the denoising seconds.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "cli/text_conditioning.h"
#include "device/device.h"
#include "pipelines/flux_t2i.h"
#include "pipelines/wan_t2v.h"

namespace cubevec::cli {

struct RunShape {
  int steps = 28;
  int64_t width = 0, height = 0, frames = 5;  // 0: the model's size (Wan: 64 x 64)
  uint64_t seed = 0;
};

class ModelRunner {
 public:
  // `dir` is a diffusers Flux or Wan folder (transformer/config.json's _class_name decides).
  static std::unique_ptr<ModelRunner> load(const std::string& dir, DType dtype, const std::string& variant, Device& device);

  bool is_wan() const { return wan_.has_value(); }
  int blocks() const;
  models::ParameterTable& parameters();
  TextConditioning text(const PromptFlags& flags) const;  // no CFG: the runs are cond only
  // Checks the shape against the model (an Error for one it cannot run).
  void check(const RunShape& shape) const;
  std::pair<Tensor, double> run(const models::PromptEmbeddings& prompt, const RunShape& shape, pipelines::StageList& stages,
                                const pipelines::StepCallback& on_step = {}) const;

 private:
  std::string dir_;
  DType dtype_ = DType::f32;
  Device& device_;
  std::optional<pipelines::FluxT2IPipeline> flux_;
  std::optional<pipelines::WanT2VPipeline> wan_;
  explicit ModelRunner(Device& device) : device_(device) {}
};

}  // namespace cubevec::cli
