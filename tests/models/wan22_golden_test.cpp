// Wan2.2 TI2V's per-token timesteps in the Wan transformer against PyTorch goldens
// (tests/data/goldens_wan22.safetensors and tests/data/wan22_ti2v_tiny, written by
// tests/reference/make_wan22_reference.py from diffusers' WanTransformer3DModel, whose timestep of
// shape [B, L] gives every token its own modulation): the per-token embeddings, block 0, the whole
// transformer; the per-token path with one value everywhere equals the per-sample one; errors.
//
// Tolerance (the issue's): max |got - expected| <= 1e-4 x max |expected| (f32).
#include <gtest/gtest.h>

#include <cmath>

#include "models/wan_transformer.h"
#include "ops/vector_ops.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace wan22_golden_test {

using namespace cubevec::testing;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

const SafetensorsFile& goldens() {
  static const SafetensorsFile file = SafetensorsFile::open(data_path("goldens_wan22.safetensors"));
  return file;
}
Tensor golden(const std::string& name) { return goldens().tensor(name); }

const models::WanTransformer3DModel& ti2v() {
  static const auto model = models::WanTransformer3DModel::load(data_path("wan22_ti2v_tiny/transformer"));
  return *model;
}

models::WanInputs inputs() {
  return {golden("transformer_ti2v.hidden_states"), golden("transformer_ti2v.timestep"), golden("transformer_ti2v.encoder_hidden_states")};
}

TEST(Wan22Golden, PerTokenEmbeddingsAreEachValuesOnce) {
  const Stream s = ops::default_op_stream();
  const models::WanTokenTimesteps tokens = ti2v().token_timesteps(golden("transformer_ti2v.timestep"), s);
  // Rows 0 (t 0 and 999) and 1 (t 0 and 250.5): three distinct values.
  ASSERT_EQ(tokens.masks.size(), 3u);
  // Spread over the tokens, each value's temb is diffusers' per-token temb.
  expect_close_rel(tokens.per_token(tokens.temb, s), golden("transformer_ti2v.temb"), 1e-5, "per-token temb");
  for (int64_t k = 0; k < 6; ++k)
    expect_close_rel(tokens.per_token(ops::contiguous(tokens.timestep_proj.select(1, k), s), s),
                     ops::contiguous(golden("transformer_ti2v.timestep_proj").select(2, k), s), 1e-5,
                     "per-token timestep_proj row " + std::to_string(k));
}

TEST(Wan22Golden, PerTokenTransformerForward) {
  const Stream s = ops::default_op_stream();
  expect_close_rel(ti2v().forward(inputs(), s), golden("transformer_ti2v.sample"), 1e-4, "TI2V sample");
  const models::WanPrologue p = ti2v().prologue(inputs(), {}, s);
  expect_close_rel(ti2v().block(0, p.state, p.shared, {}, s).hidden, golden("transformer_ti2v.intermediate.block0.out"), 1e-4, "block 0");
  // bf16 activations (diffusers' bf16 run: modulation in f32, the rest rounded to bf16): within 2e-2.
  models::ForwardContext bf16;
  bf16.activations = DType::bf16;
  expect_close_rel(ti2v().forward(inputs(), s, bf16), golden("transformer_ti2v.sample"), 2e-2, "TI2V sample, bf16 activations");
}

TEST(Wan22Golden, OneValueEverywhereEqualsThePerSampleTimestep) {
  const Stream s = ops::default_op_stream();
  models::WanInputs per_sample = inputs();
  per_sample.timestep = Tensor::from_vector(std::vector<float>{999.0f, 250.5f}, {2});
  models::WanInputs per_token = inputs();
  std::vector<float> t(2 * 18);
  for (int i = 0; i < 36; ++i) t[static_cast<std::size_t>(i)] = i < 18 ? 999.0f : 250.5f;
  per_token.timestep = Tensor::from_vector(t, {2, 18});
  expect_close_rel(ti2v().forward(per_token, s), ti2v().forward(per_sample, s), 1e-6, "per-token = per-sample");
}

TEST(Wan22Golden, PerTokenTimestepErrors) {
  const Stream s = ops::default_op_stream();
  models::WanInputs in = inputs();
  in.timestep = Tensor::from_vector(std::vector<float>(2 * 17, 1.0f), {2, 17});
  EXPECT_NE(message_of([&] { ti2v().forward(in, s); }).find("or [2, 18] (one per token)"), std::string::npos);
  std::vector<float> many(2 * 18);
  for (std::size_t i = 0; i < many.size(); ++i) many[i] = static_cast<float>(i);
  in.timestep = Tensor::from_vector(many, {2, 18});
  EXPECT_NE(message_of([&] { ti2v().forward(in, s); }).find("more than 16 distinct values"), std::string::npos);
}

}  // namespace wan22_golden_test
}  // namespace cubevec
