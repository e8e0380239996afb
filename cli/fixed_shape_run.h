// One model folder run again and again at one shape, conditional branch only, with the caller's
// stages: what tune-cache (a run per candidate setting) and quantize (a run per calibration input)
// do. The family comes from the registry (pipelines/model_family.h); the request is the library's.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "device/device.h"
#include "pipelines/model_family.h"

namespace cubevec::cli {

struct FixedShape {
  int steps = 28;
  int64_t width = 0, height = 0, frames = 5;  // 0: the model's size (Wan: 64 x 64)
  uint64_t seed = 0;
};

class FixedShapeRun {
 public:
  // Loads `dir`'s transformer and VAE (weights as `dtype`) and checks the shape against it.
  FixedShapeRun(const std::string& dir, DType dtype, const std::string& variant, const FixedShape& shape, Device& device);

  pipelines::ModelPipeline& model() { return *model_; }
  const pipelines::ModelPipeline& model() const { return *model_; }
  bool video() const { return model_->video(); }
  // The prompt through the folder's text encoder (or its prompt_embeds file).
  pipelines::TextConditioning text(const pipelines::PromptRequest& prompt) const;
  // The final latents and the denoising seconds.
  std::pair<Tensor, double> run(const models::PromptEmbeddings& prompt, pipelines::StageList& stages,
                                const pipelines::StepCallback& on_step = {}) const;

 private:
  std::string dir_;
  DType dtype_;
  Device& device_;
  std::unique_ptr<pipelines::ModelPipeline> model_;
  pipelines::Request request_;
};

}  // namespace cubevec::cli
