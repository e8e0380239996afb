// What each family's ModelPipeline (pipelines/model_family.h) does the same way over its own
// pipeline class P (FluxT2IPipeline, WanT2VPipeline, with its options O): loading the weights, the
// transformer's facts the stages need, and denoising with the options the family makes from a
// request. A family file derives from it and writes only what is its own.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "pipelines/model_family.h"
#include "pipelines/stages/offload.h"

namespace cubevec::pipelines {

template <class P, class O>
class FamilyPipelineBase : public ModelPipeline {
 public:
  explicit FamilyPipelineBase(P pipeline) : p_(std::move(pipeline)) {}

  void load_weights(const std::string& model_dir, DType dtype, const std::string& variant) override {
    p_ = P::load(model_dir, dtype, variant);
  }

  int blocks() const override { return p_.transformer().block_count(); }
  int64_t attention_heads() const override { return p_.transformer().config().num_attention_heads; }
  std::vector<std::string> block_modules() const override { return pipelines::block_modules(p_.transformer()); }
  models::TensorParallelPlan tensor_parallel_plan() const override { return p_.transformer().tensor_parallel_plan(); }
  models::ParameterTable& transformer_parameters() override { return p_.mutable_transformer().mutable_parameters(); }
  const models::ParameterTable& transformer_parameters() const override { return p_.transformer().parameters(); }
  const models::ParameterTable* vae_parameters() const override { return p_.vae() ? &p_.vae()->parameters() : nullptr; }

  Tensor denoise(const TextConditioning& text, const Request& request, const RunContext& run, Device& device, const StepCallback& on_step,
                 T2ITimings& timings, StageList* stages) const override {
    return p_.denoise(text.positive, text.negative ? &*text.negative : nullptr, options(request, run), device, on_step, timings, stages);
  }

 protected:
  // The family's options for a request with its defaults applied.
  virtual O options(const Request& request, const RunContext& run) const = 0;

  P p_;
};

}  // namespace cubevec::pipelines
