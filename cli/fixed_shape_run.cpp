#include "cli/fixed_shape_run.h"

namespace cubevec::cli {

namespace {

pipelines::RunContext one_device(DType activations) {
  pipelines::RunContext run;
  run.activations = activations;
  return run;
}

}  // namespace

FixedShapeRun::FixedShapeRun(const std::string& dir, DType dtype, const std::string& variant, const FixedShape& shape, Device& device)
    : dir_(dir), dtype_(dtype), device_(device), model_(pipelines::load_model_pipeline_meta(dir, dtype)) {
  model_->load_weights(dir, dtype, variant);
  request_.num_inference_steps = shape.steps;
  request_.seed = shape.seed;
  request_.cfg = "off";
  if (model_->video()) {
    request_.width = shape.width > 0 ? shape.width : 64;
    request_.height = shape.height > 0 ? shape.height : 64;
    request_.num_frames = shape.frames;
  } else {
    if (shape.width > 0) request_.width = shape.width;
    if (shape.height > 0) request_.height = shape.height;
  }
  std::vector<std::string> from_defaults;
  request_ = model_->with_defaults(request_, dir, from_defaults);
  model_->check(request_, one_device(dtype), false);
}

pipelines::TextConditioning FixedShapeRun::text(const pipelines::PromptRequest& prompt) const {
  pipelines::Request request = request_;
  request.text = prompt;
  return model_->one_shot_text(dir_, request, {dtype_, false, ""}, false, device_.default_stream());
}

std::pair<Tensor, double> FixedShapeRun::run(const models::PromptEmbeddings& prompt, pipelines::StageList& stages,
                                             const pipelines::StepCallback& on_step) const {
  pipelines::T2ITimings timings;
  pipelines::TextConditioning text;
  text.positive = prompt;
  const Tensor latents = model_->denoise(text, request_, one_device(dtype_), device_, on_step, timings, &stages);
  return {latents, timings.denoise_s};
}

}  // namespace cubevec::cli
