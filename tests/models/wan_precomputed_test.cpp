// The Wan forward's precomputed inputs (WanInputs::temb, timestep_proj, context, image_context; the
// denoising loop computes them ahead through Denoiser::prepare): a forward given rows of an
// all-steps time embedding and the prompt's embeddings equals the forward that computes its own,
// bit for bit (f32 and bf16, batch 1 and 2, text-to-video and the image branch); the loop really
// uses them (fewer kernels, same latents) unless a stage streams the weights; wrong shapes, dtypes
// and combinations are named errors.
#include <gtest/gtest.h>

#include <cmath>

#include "models/wan_transformer.h"
#include "ops/vector_ops.h"
#include "pipelines/wan_t2v.h"

#include "common/loop_runs.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace wan_precomputed_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

const models::WanTransformer3DModel& tiny(const std::string& folder) {
  static std::map<std::string, std::unique_ptr<models::WanTransformer3DModel>> cache;
  auto& slot = cache[folder];
  if (!slot) slot = models::WanTransformer3DModel::load(data_path(folder + "/transformer"));
  return *slot;
}

Tensor vector_of(const std::vector<float>& v) { return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}); }

// A forward's raw inputs: a 3 x 2 x 3 patch grid, 6 text tokens, and the image tokens when the model
// has the image branch.
models::WanInputs inputs(const models::WanTransformer3DModel& model, int64_t batch, float timestep) {
  const models::WanConfig& c = model.config();
  models::WanInputs in;
  in.hidden_states = random_tensor({batch, c.in_channels, 3, 4, 6}, 21, DType::f32, 1.0f);
  in.timestep = vector_of(std::vector<float>(static_cast<std::size_t>(batch), timestep));
  in.encoder_hidden_states = random_tensor({batch, 6, c.text_dim}, 22, DType::f32, 1.0f);
  if (c.has_image_branch()) {
    const int64_t rows = c.pos_embed_seq_len > 0 ? c.pos_embed_seq_len : 5;
    in.encoder_hidden_states_image = random_tensor({batch, rows, c.image_dim}, 23, DType::f32, 1.0f);
  }
  return in;
}

TEST(WanPrecomputed, EachForwardsRowsEqualWhatItComputesItself) {
  const Stream s = ops::default_op_stream();
  const std::vector<float> times{999.0f, 750.0f, 333.0f};
  for (const std::string folder : {"wan_tiny", "wan_i2v_tiny"}) {
    const auto& model = tiny(folder);
    for (const DType act : {DType::f32, DType::bf16})
      for (const int64_t batch : {int64_t{1}, int64_t{2}}) {
        SCOPED_TRACE(folder + " " + std::string(dtype_name(act)) + " batch " + std::to_string(batch));
        models::ForwardContext ctx;
        ctx.activations = act;
        std::vector<float> all;
        for (const float t : times) all.insert(all.end(), static_cast<std::size_t>(batch), t);
        const auto [temb, proj] = model.time_embedding(vector_of(all), s, act);
        const models::WanInputs first = inputs(model, batch, times[0]);
        const Tensor context = model.text_embedding(first.encoder_hidden_states, s, act);
        const Tensor image =
            model.config().has_image_branch() ? model.image_embedding(first.encoder_hidden_states_image, s, act) : Tensor();
        for (std::size_t step = 0; step < times.size(); ++step) {
          models::WanInputs in = inputs(model, batch, times[step]);
          const Tensor own = model.forward(in, s, ctx);
          in.temb = temb.narrow(0, static_cast<int64_t>(step) * batch, batch);
          in.timestep_proj = proj.narrow(0, static_cast<int64_t>(step) * batch, batch);
          in.context = context;
          in.image_context = image;
          expect_close_rel(model.forward(in, s, ctx), own, 0, "step " + std::to_string(step));
        }
        // Another step's rows give another output: the comparison above can fail.
        models::WanInputs in = inputs(model, batch, times[0]);
        const std::vector<double> own = values(model.forward(in, s, ctx));
        in.temb = temb.narrow(0, batch, batch);
        in.timestep_proj = proj.narrow(0, batch, batch);
        EXPECT_NE(values(model.forward(in, s, ctx)), own);
      }
  }
}

TEST(WanPrecomputed, WrongShapesDtypesAndCombinationsAreNamedErrors) {
  const Stream s = ops::default_op_stream();
  const auto& model = tiny("wan_tiny");
  const int64_t d = model.config().inner_dim();
  const auto message = [&](const models::WanInputs& in) { return message_of([&] { model.forward(in, s); }); };
  models::WanInputs in = inputs(model, 2, 500.0f);
  const auto [temb, proj] = model.time_embedding(in.timestep, s);
  in.temb = temb.narrow(0, 0, 1);
  in.timestep_proj = proj;
  EXPECT_NE(message(in).find("the precomputed temb must be f32 [2, " + std::to_string(d) + "] (the batch from hidden_states"),
            std::string::npos)
      << message(in);
  in.temb = temb;
  in.timestep_proj = Tensor();
  EXPECT_NE(message(in).find("the precomputed timestep_proj must be f32 [2, 6, " + std::to_string(d) + "]"), std::string::npos);
  in.timestep_proj = ops::cast(proj, DType::bf16, s);
  EXPECT_NE(message(in).find("got bf16"), std::string::npos) << message(in);
  in = inputs(model, 2, 500.0f);
  in.context = Tensor::zeros({2, 7, d}, DType::f32);  // 7 text tokens for 6
  EXPECT_NE(message(in).find("the precomputed context must be f32 [2, 6, " + std::to_string(d) + "]"), std::string::npos);
  in = inputs(model, 2, 500.0f);
  in.image_context = Tensor::zeros({2, 5, d}, DType::f32);
  EXPECT_NE(message(in).find("has no image branch"), std::string::npos);
  in = inputs(model, 1, 500.0f);
  in.timestep = Tensor::zeros({1, 18}, DType::f32);  // one per token
  in.temb = temb.narrow(0, 0, 1);
  in.timestep_proj = proj.narrow(0, 0, 1);
  EXPECT_NE(message(in).find("needs one timestep per sample, not one per token"), std::string::npos);
  in = inputs(model, 1, 500.0f);
  in.temb = temb.narrow(0, 0, 1);
  EXPECT_NE(message(in).find("timestep_proj must be f32 [1, 6, " + std::to_string(d) +
                             "] (the batch from hidden_states [1, 4, 3, 4, 6]), got nothing (temb and timestep_proj go together)"),
            std::string::npos)
      << message(in);
  const auto& i2v = tiny("wan_i2v_tiny");
  models::WanInputs image_in = inputs(i2v, 1, 500.0f);
  image_in.image_context = Tensor::zeros({1, 0, i2v.config().inner_dim()}, DType::f32);
  EXPECT_NE(message_of([&] { i2v.forward(image_in, s); }).find("image_context must be f32 [1, -1, 32]"), std::string::npos)
      << message_of([&] { i2v.forward(image_in, s); });
  EXPECT_NE(message_of([&] {
              model.image_embedding(Tensor::zeros({1, 5, 32}, DType::f32), s);
            }).find("has no image branch"),
            std::string::npos);
  // Non-finite timesteps are refused (a NaN per-token timestep once turned every sample NaN).
  in = inputs(model, 2, NAN);
  EXPECT_NE(message(in).find("wan forward: timestep holds nan at element 0 of [2]; expected finite values"), std::string::npos)
      << message(in);
}

TEST(WanPrecomputed, IntegerPerTokenTimestepsEqualFloatOnes) {
  const Stream s = ops::default_op_stream();
  const auto& model = tiny("wan_tiny");
  models::WanInputs in = inputs(model, 1, 0.0f);
  std::vector<float> f(18, 500.0f);
  std::vector<int64_t> n(18, 500);
  f[0] = 0.0f, n[0] = 0;
  in.timestep = Tensor::from_vector(f, {1, 18});
  const std::vector<double> want = values(model.forward(in, s));
  in.timestep = Tensor::from_vector(n, {1, 18});
  EXPECT_EQ(values(model.forward(in, s)), want);
}

LoopRun denoise(const pipelines::WanT2VPipeline& pipeline, bool streaming, DType act, pipelines::CfgMode cfg) {
  const int64_t text_dim = pipeline.transformer().config().text_dim;
  const pipelines::PromptEmbeddings pos{random_tensor({1, 6, text_dim}, 1, DType::f32, 1.0f), {}};
  const pipelines::PromptEmbeddings neg{random_tensor({1, 6, text_dim}, 2, DType::f32, 1.0f), {}};
  pipelines::T2VOptions o;
  o.width = 48, o.height = 32, o.frames = 9;
  o.steps = 4;
  o.cfg = cfg;
  o.activations = act;
  o.seed = 5;
  return run_denoising(pipeline, o, pos, cfg == pipelines::CfgMode::off ? nullptr : &neg, streaming);
}

TEST(WanPrecomputed, TheLoopComputesThemAheadWithTheSameLatents) {
  const pipelines::WanT2VPipeline pipeline = pipelines::WanT2VPipeline::load(data_path("wan_tiny"));
  for (const DType act : {DType::f32, DType::bf16})
    for (const pipelines::CfgMode cfg : {pipelines::CfgMode::off, pipelines::CfgMode::fused, pipelines::CfgMode::streams}) {
      SCOPED_TRACE(std::string(dtype_name(act)) + " cfg " + std::string(pipelines::cfg_mode_name(cfg)));
      denoise(pipeline, true, act, cfg);  // a shape's first calls tune its kernels: not counted
      const LoopRun ahead = denoise(pipeline, false, act, cfg), per_step = denoise(pipeline, true, act, cfg);
      expect_close_rel(ahead.latents, per_step.latents, 0, "latents");
      // Steps 2 to 4 run neither time_proj nor the two text embedder Linears (per forward).
      EXPECT_GE(per_step.kernels, ahead.kernels + 3u * 3u) << per_step.kernels << " " << ahead.kernels;
    }
}

}  // namespace wan_precomputed_test
}  // namespace cubevec
