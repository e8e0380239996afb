#include "cli/model_runner.h"

#include "tensor/error.h"
#include "tensor/strict_json.h"

namespace cubevec::cli {

std::unique_ptr<ModelRunner> ModelRunner::load(const std::string& dir, DType dtype, const std::string& variant, Device& device) {
  std::unique_ptr<ModelRunner> r(new ModelRunner(device));
  r->dir_ = dir;
  r->dtype_ = dtype;
  const nlohmann::json config = read_json_file(dir + "/transformer/config.json");
  if (config.is_object() && config.value("_class_name", std::string()) == "WanTransformer3DModel")
    r->wan_.emplace(pipelines::WanT2VPipeline::load(dir, dtype, variant));
  else
    r->flux_.emplace(pipelines::FluxT2IPipeline::load(dir, dtype, variant));
  return r;
}

int ModelRunner::blocks() const { return wan_ ? wan_->transformer().block_count() : flux_->transformer().block_count(); }

models::ParameterTable& ModelRunner::parameters() {
  return wan_ ? wan_->mutable_transformer().mutable_parameters() : flux_->mutable_transformer().mutable_parameters();
}

TextConditioning ModelRunner::text(const PromptFlags& prompt_flags) const {
  PromptFlags flags = prompt_flags;
  flags.dtype = dtype_;
  return wan_ ? wan_text(dir_, flags, false, false, wan_->transformer().config(), device_.default_stream())
              : flux_text(dir_, flags, false, false, flux_->transformer().config(), device_.default_stream());
}

namespace {

pipelines::T2IOptions flux_options(const pipelines::FluxT2IPipeline& p, const RunShape& s, DType dtype) {
  pipelines::T2IOptions o;
  o.steps = s.steps, o.seed = s.seed, o.activations = dtype;
  o.width = s.width > 0 ? s.width : p.default_image_size();
  o.height = s.height > 0 ? s.height : p.default_image_size();
  return o;
}

pipelines::T2VOptions wan_options(const RunShape& s, DType dtype) {
  pipelines::T2VOptions o;
  o.steps = s.steps, o.seed = s.seed, o.cfg = pipelines::CfgMode::off, o.activations = dtype, o.frames = s.frames;
  o.width = s.width > 0 ? s.width : 64, o.height = s.height > 0 ? s.height : 64;
  return o;
}

}  // namespace

void ModelRunner::check(const RunShape& s) const {
  if (wan_) wan_->check(wan_options(s, dtype_), false);
  else flux_->check(flux_options(*flux_, s, dtype_), false);
}

std::pair<Tensor, double> ModelRunner::run(const models::PromptEmbeddings& prompt, const RunShape& s, pipelines::StageList& stages,
                                           const pipelines::StepCallback& on_step) const {
  pipelines::T2ITimings timings;
  const Tensor latents = wan_ ? wan_->denoise(prompt, nullptr, wan_options(s, dtype_), device_, on_step, timings, &stages)
                              : flux_->denoise(prompt, nullptr, flux_options(*flux_, s, dtype_), device_, on_step, timings, &stages);
  return {latents, timings.denoise_s};
}

}  // namespace cubevec::cli
