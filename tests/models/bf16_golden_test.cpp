// bf16 end to end (weights and activations in bf16, sums in f32) against torch bf16 goldens
// (tests/data/goldens_bf16.safetensors, written by tests/reference/make_bf16_reference.py with
// diffusers' bf16 rounding points): the Flux transformer, the Wan transformer, and the 4-step Flux
// pipeline.
//
// Tolerance: max |got - expected| <= 2^-5 * max |expected|. cubevec rounds once where diffusers
// rounds after each elementwise op (AdaLN, gated residuals), which moves outputs by one or two
// bf16 ulps of the output (the reference script measured 1.2e-2 / 1.6e-2 for alternative rounding
// points); 2^-5 leaves room for those and still fails on a wrong rounding rule (keeping Flux's
// t x 1000 in f32 instead of bf16 is 0.41 away). Measured on 2026-11-23: Flux transformer 1.8e-2,
// Wan transformer 1.0e-2, Flux pipeline latents 9.4e-3 of max |expected|.
#include <gtest/gtest.h>

#include "models/flux_transformer.h"
#include "models/wan_transformer.h"
#include "ops/vector_ops.h"
#include "pipelines/flux_t2i.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace bf16_golden_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

constexpr double kTolerance = 1.0 / 32;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

const SafetensorsFile& goldens() {
  static const SafetensorsFile file = SafetensorsFile::open(data_path("goldens_bf16.safetensors"));
  return file;
}
Tensor golden(const std::string& name) { return goldens().tensor(name); }

TEST(Bf16Golden, FluxTransformer) {
  const auto model = models::FluxTransformer2DModel::load(data_path("flux_tiny/transformer"), DType::bf16);
  models::FluxInputs in;
  in.hidden_states = golden("flux_transformer.hidden_states");
  in.encoder_hidden_states = golden("flux_transformer.encoder_hidden_states");
  in.pooled_projections = golden("flux_transformer.pooled_projections");
  in.timestep = golden("flux_transformer.timestep");
  in.guidance = golden("flux_transformer.guidance");
  in.img_ids = golden("flux_transformer.img_ids");
  in.txt_ids = golden("flux_transformer.txt_ids");
  const Tensor out = model->forward(in, ops::default_op_stream(), {.activations = DType::bf16});
  EXPECT_EQ(out.dtype(), DType::bf16);
  expect_close_rel(ops::cast(out, DType::f32), golden("flux_transformer.expected"), kTolerance, "flux bf16 transformer");
}

TEST(Bf16Golden, WanTransformer) {
  const auto model = models::WanTransformer3DModel::load(data_path("wan_tiny/transformer"), DType::bf16);
  const models::WanInputs in{golden("wan_transformer.hidden_states"), golden("wan_transformer.timestep"),
                             golden("wan_transformer.encoder_hidden_states")};
  const Tensor out = model->forward(in, ops::default_op_stream(), {.activations = DType::bf16});
  EXPECT_EQ(out.dtype(), DType::bf16);
  expect_close_rel(ops::cast(out, DType::f32), golden("wan_transformer.expected"), kTolerance, "wan bf16 transformer");
}

TEST(Bf16Golden, FluxPipelineFourSteps) {
  pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(data_path("flux_tiny"), DType::bf16);
  pipelines::T2IOptions o;
  o.width = o.height = 32;
  o.steps = 4;
  o.guidance = golden("flux_pipeline.guidance").data<float>()[0];
  o.initial_noise = golden("flux_pipeline.noise");
  o.activations = DType::bf16;
  const pipelines::PromptEmbeddings embeddings{golden("flux_pipeline.encoder_hidden_states"), golden("flux_pipeline.pooled_projections")};
  Device device(builtin_cpu_profile());
  pipelines::T2ITimings timings;
  const Tensor latents = pipeline.denoise(embeddings, nullptr, o, device, {}, timings);
  expect_close_rel(latents, golden("flux_pipeline.expected"), kTolerance, "flux bf16 pipeline latents");
}

}  // namespace bf16_golden_test
}  // namespace cubevec
