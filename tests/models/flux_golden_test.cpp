// The Flux port against PyTorch goldens (tests/data/goldens_flux.safetensors and the tiny diffusers
// checkpoints in tests/data/flux_tiny/, written by tests/reference/make_flux_reference.py from the
// porting spec): RoPE table, timestep sinusoid, one double block, one single block, the whole
// transformer (with and without guidance), latent packing, the bf16 checkpoint, the VAE decoders,
// and a 4-step pipeline run from the reference's noise.
//
// Tolerance (the issue's): max |got - expected| <= 1e-4 * max |expected| in f32 (the goldens are
// float64 runs rounded to f32); tables and sinusoids 1e-6 absolute.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "models/autoencoder_kl.h"
#include "models/flux_transformer.h"
#include "ops/vector_ops.h"
#include "pipelines/flux_t2i.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace flux_golden_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

const SafetensorsFile& goldens() {
  static const SafetensorsFile file = SafetensorsFile::open(data_path("goldens_flux.safetensors"));
  return file;
}
Tensor golden(const std::string& name) { return goldens().tensor(name); }

const models::FluxTransformer2DModel& tiny(const std::string& dir) {
  static std::map<std::string, std::unique_ptr<models::FluxTransformer2DModel>> cache;
  auto& slot = cache[dir];
  if (!slot) slot = models::FluxTransformer2DModel::load(data_path("flux_tiny/" + dir));
  return *slot;
}

TEST(FluxGolden, RopeTablesAndSinusoid) {
  for (const auto& [name, axes] : {std::pair<std::string, std::vector<int64_t>>{"rope", {4, 6, 6}}, {"rope_axes_2_2_4", {2, 2, 4}}}) {
    const models::RopeTable t = models::axial_rope(golden(name + ".ids"), axes);
    expect_close_rel(t.cos, golden(name + ".cos"), 0, name + " cos", 1e-6);
    expect_close_rel(t.sin, golden(name + ".sin"), 0, name + " sin", 1e-6);
  }
  expect_close_rel(models::timestep_sinusoid(golden("timestep_sinusoid.timestep")), golden("timestep_sinusoid.expected"), 0, "sinusoid",
                   1e-6);
}

TEST(FluxGolden, DoubleAndSingleBlocks) {
  const auto& model = tiny("transformer");
  const Stream s = ops::default_op_stream();
  const Tensor silu = ops::activation(golden("double_block.temb"), ops::Activation::silu, s);
  const models::RopeTable rope{golden("double_block.cos"), golden("double_block.sin")};
  const models::BlockState out1 = model.double_blocks()[1].forward(
      {golden("double_block.hidden_states"), golden("double_block.encoder_hidden_states")}, {silu, rope}, {}, s);
  const Tensor h = out1.hidden, c = out1.encoder;
  expect_close_rel(h, golden("double_block.expected_hidden_states"), 1e-4, "double block hidden");
  expect_close_rel(c, golden("double_block.expected_encoder_hidden_states"), 1e-4, "double block context");

  const Tensor silu1 = ops::activation(golden("single_block.temb"), ops::Activation::silu, s);
  const Tensor ctx = golden("single_block.encoder_hidden_states"), hid = golden("single_block.hidden_states");
  const models::BlockState single =
      model.single_blocks()[0].forward({hid, ctx}, {silu1, {golden("single_block.cos"), golden("single_block.sin")}}, {}, s);
  const Tensor out = ops::concat({single.encoder, single.hidden}, 1, s);
  expect_close_rel(out.narrow(1, ctx.size(1), hid.size(1)), golden("single_block.expected_hidden_states"), 1e-4, "single hidden");
  expect_close_rel(out.narrow(1, 0, ctx.size(1)), golden("single_block.expected_encoder_hidden_states"), 1e-4, "single context");
}

models::FluxInputs inputs_of(const std::string& c, bool guidance) {
  models::FluxInputs in;
  in.hidden_states = golden(c + ".hidden_states");
  in.encoder_hidden_states = golden(c + ".encoder_hidden_states");
  in.pooled_projections = golden(c + ".pooled_projections");
  in.timestep = golden(c + ".timestep");
  in.img_ids = golden(c + ".img_ids");
  in.txt_ids = golden(c + ".txt_ids");
  if (guidance) in.guidance = golden(c + ".guidance");
  return in;
}

TEST(FluxGolden, WholeTransformerWithAndWithoutGuidance) {
  const Stream s = ops::default_op_stream();
  expect_close_rel(tiny("transformer").forward(inputs_of("transformer", true), s), golden("transformer.expected"), 1e-4, "transformer");
  expect_close_rel(tiny("transformer_noguidance").forward(inputs_of("transformer_noguidance", false), s),
                   golden("transformer_noguidance.expected"), 1e-4, "transformer without guidance");
  // The same checkpoint stored in bf16 (values exactly representable) loads to the same weights.
  const auto bf16 = models::FluxTransformer2DModel::load(data_path("flux_tiny/transformer_bf16"));
  const auto& f32 = tiny("transformer");
  for (std::size_t i = 0; i < f32.parameters().specs().size(); ++i)
    ASSERT_EQ(values(*bf16->parameters().specs()[i].slot), values(*f32.parameters().specs()[i].slot)) << f32.parameters().specs()[i].name;
}

TEST(FluxGolden, ForwardInputErrorsNameTheArgument) {
  const auto& model = tiny("transformer");
  const Stream s = ops::default_op_stream();
  auto in = inputs_of("transformer", true);
  in.guidance = {};
  EXPECT_NE(message_of([&] { model.forward(in, s); }).find("guidance is missing (expected [2])"), std::string::npos);
  in = inputs_of("transformer", true);
  in.encoder_hidden_states = Tensor::zeros({2, 5, 32}, DType::f32);
  EXPECT_NE(message_of([&] { model.forward(in, s); }).find("encoder_hidden_states must be [2, -1, 40]"), std::string::npos);
  in = inputs_of("transformer", true);
  in.img_ids = Tensor::zeros({15, 3}, DType::f32);
  EXPECT_NE(message_of([&] { model.forward(in, s); }).find("img_ids must be [16, 3]"), std::string::npos);
  // A size that comes from another argument names that argument: here the batch of hidden_states.
  in = inputs_of("transformer", true);
  in.hidden_states = Tensor::zeros({3, 16, 64}, DType::f32);
  EXPECT_NE(message_of([&] {
              model.forward(in, s);
            }).find("encoder_hidden_states must be [3, -1, 40] (-1: any; the batch from hidden_states [3, 16, 64]), got [2, 5, 40]"),
            std::string::npos)
      << message_of([&] { model.forward(in, s); });
  // 3-d ids show their shape as given, not after their first row was taken.
  in = inputs_of("transformer", true);
  in.img_ids = Tensor::zeros({16, 3, 1}, DType::f32);
  EXPECT_NE(message_of([&] { model.forward(in, s); }).find("got [16, 3, 1]"), std::string::npos)
      << message_of([&] { model.forward(in, s); });
  // Dtypes are checked by name before any kernel casts or reads them.
  const struct {
    Tensor models::FluxInputs::*field;
    Shape shape;
    DType dtype;
    const char* expected;
  } dtypes[] = {
      {&models::FluxInputs::hidden_states,
       {2, 16, 64},
       DType::i64,
       "flux forward: hidden_states must be f32, bf16 or f16, got i64 [2, 16, 64]"},
      {&models::FluxInputs::timestep, {2}, DType::i32, "flux forward: timestep must be f32, bf16 or i64, got i32 [2]"},
      {&models::FluxInputs::guidance, {2}, DType::f16, "flux forward: guidance must be f32, bf16 or i64, got f16 [2]"},
      {&models::FluxInputs::txt_ids, {5, 3}, DType::u8, "flux forward: txt_ids must be f32, bf16, i32 or i64, got u8 [5, 3]"},
  };
  for (const auto& d : dtypes) {
    in = inputs_of("transformer", true);
    in.*d.field = Tensor::zeros(d.shape, d.dtype);
    EXPECT_NE(message_of([&] { model.forward(in, s); }).find(d.expected), std::string::npos) << message_of([&] { model.forward(in, s); });
  }
  in = inputs_of("transformer", true);
  in.hidden_states = Tensor::zeros({2, 0, 64}, DType::f32);
  EXPECT_NE(message_of([&] { model.forward(in, s); }).find("must hold at least one sample and one image token"), std::string::npos);
  auto ng = inputs_of("transformer_noguidance", false);
  ng.guidance = Tensor::zeros({2}, DType::f32);
  EXPECT_NE(message_of([&] { tiny("transformer_noguidance").forward(ng, s); }).find("no guidance embedder"), std::string::npos);
}

TEST(FluxGolden, LatentPackingRoundTrip) {
  const Stream s = ops::default_op_stream();
  const Tensor latents = golden("pack.latents");
  const Tensor packed = models::pack_latents(latents, s);
  EXPECT_EQ(values(packed), values(golden("pack.expected")));
  EXPECT_EQ(values(models::unpack_latents(packed, latents.size(2), latents.size(3), s)), values(latents));
  EXPECT_EQ(values(models::flux_image_ids(latents.size(2), latents.size(3))), values(golden("pack.img_ids")));
}

TEST(FluxGolden, VaeDecoders) {
  const Stream s = ops::default_op_stream();
  for (const auto& [dir, c] : {std::pair<std::string, std::string>{"vae", "vae_decode"}, {"vae_postquant", "vae_postquant_decode"}}) {
    const models::AutoencoderKLDecoder vae = models::load_autoencoder_kl(data_path("flux_tiny/" + dir));
    expect_close_rel(vae.decode(golden(c + ".z"), s), golden(c + ".expected"), 1e-4, c);
  }
}

TEST(FluxGolden, FourStepPipelineFromTheReferenceNoise) {
  const std::string root = data_path("flux_tiny");
  const pipelines::FluxT2IPipeline pipeline(models::FluxTransformer2DModel::load(root + "/transformer"),
                                            std::make_unique<models::AutoencoderKLDecoder>(models::load_autoencoder_kl(root + "/vae")),
                                            pipelines::FlowMatchConfig::load(root + "/scheduler/scheduler_config.json"));
  Device& device = default_device();
  pipelines::T2IOptions o;
  o.initial_noise = golden("pipeline.noise");
  o.height = o.initial_noise.size(2) * pipeline.vae()->config().upscale();
  o.width = o.initial_noise.size(3) * pipeline.vae()->config().upscale();
  o.steps = 4;
  o.guidance = 3.5;
  const pipelines::PromptEmbeddings pos{golden("pipeline.encoder_hidden_states"), golden("pipeline.pooled_projections")};
  pipelines::T2ITimings timings;
  int calls = 0;
  const Tensor packed = pipeline.denoise(
      pos, nullptr, o, device, [&](int, int, double) { ++calls; }, timings);
  EXPECT_EQ(calls, 4);
  expect_close_rel(models::unpack_latents(packed, o.initial_noise.size(2), o.initial_noise.size(3), device.default_stream()),
                   golden("pipeline.expected_latents"), 1e-4, "latents after 4 steps");
  expect_close_rel(pipeline.decode(packed, o, device, timings), golden("pipeline.expected"), 1e-4, "decoded image");
}

}  // namespace flux_golden_test
}  // namespace cubevec
