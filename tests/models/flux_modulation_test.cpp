// The Flux modulation computed for many steps at once (FluxTransformer2DModel::modulation, used by
// the denoising loop through Denoiser::prepare): each forward given its rows of the table equals the
// forward that computes its own, bit for bit (f32 and bf16 activations, batch 1 and 2, with and
// without the guidance embedder); the loop really uses it (fewer kernels, same latents) unless a
// stage streams the weights or a modulation Linear is quantized; bad rows and shapes are named errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "models/flux_transformer.h"
#include "ops/vector_ops.h"
#include "pipelines/flux_t2i.h"

#include "common/loop_runs.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace flux_modulation_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

const models::FluxTransformer2DModel& tiny(const std::string& dir) {
  static std::map<std::string, std::unique_ptr<models::FluxTransformer2DModel>> cache;
  auto& slot = cache[dir];
  if (!slot) slot = models::FluxTransformer2DModel::load(data_path("flux_tiny/" + dir));
  return *slot;
}

Tensor vector_of(const std::vector<float>& v) { return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}); }

// One forward's inputs for the tiny checkpoint (16 image tokens, 5 text tokens), batch `batch`.
models::FluxInputs inputs(const models::FluxTransformer2DModel& model, int64_t batch, float timestep) {
  const bool guidance = model.config().guidance_embeds;
  models::FluxInputs in;
  in.hidden_states = random_tensor({batch, 16, 64}, 11, DType::f32, 1.0f);
  in.encoder_hidden_states = random_tensor({batch, 5, 40}, 12, DType::f32, 1.0f);
  in.pooled_projections = random_tensor({batch, model.config().pooled_projection_dim}, 13, DType::f32, 1.0f);
  in.timestep = vector_of(std::vector<float>(static_cast<std::size_t>(batch), timestep));
  if (guidance) in.guidance = vector_of(std::vector<float>(static_cast<std::size_t>(batch), 3.5f));
  in.img_ids = models::flux_image_ids(8, 8);
  in.txt_ids = Tensor::zeros({5, 3}, DType::f32);
  return in;
}

TEST(FluxModulation, EachForwardsRowsOfTheTableEqualItsOwnModulation) {
  const Stream s = ops::default_op_stream();
  const std::vector<float> times{1.0f, 0.75f, 0.3f};
  for (const std::string dir : {"transformer", "transformer_noguidance"}) {
    const auto& model = tiny(dir);
    const bool guidance = model.config().guidance_embeds;
    for (const DType act : {DType::f32, DType::bf16})
      for (const int64_t batch : {int64_t{1}, int64_t{2}}) {
        SCOPED_TRACE(dir + " " + std::string(dtype_name(act)) + " batch " + std::to_string(batch));
        models::ForwardContext ctx;
        ctx.activations = act;
        // The table's rows: step after step, each step's batch rows.
        const models::FluxInputs first = inputs(model, batch, times[0]);
        std::vector<float> t, g;
        std::vector<Tensor> pooled;
        for (const float time : times) {
          t.insert(t.end(), static_cast<std::size_t>(batch), time);
          g.insert(g.end(), static_cast<std::size_t>(batch), 3.5f);
          pooled.push_back(first.pooled_projections);
        }
        const models::FluxModulation table =
            model.modulation(vector_of(t), guidance ? vector_of(g) : Tensor(), ops::concat(pooled, 0, s), s, act);
        ASSERT_EQ(table.rows(), batch * static_cast<int64_t>(times.size()));
        for (std::size_t step = 0; step < times.size(); ++step) {
          models::FluxInputs in = inputs(model, batch, times[step]);
          const Tensor own = model.forward(in, s, ctx);
          in.modulation = std::make_shared<const models::FluxModulation>(table.slice(static_cast<int64_t>(step) * batch, batch));
          expect_close_rel(model.forward(in, s, ctx), own, 0, "step " + std::to_string(step));
        }
        // Another step's rows give another output: the comparison above can fail.
        models::FluxInputs in = inputs(model, batch, times[0]);
        const std::vector<double> own = values(model.forward(in, s, ctx));
        in.modulation = std::make_shared<const models::FluxModulation>(table.slice(batch, batch));
        EXPECT_NE(values(model.forward(in, s, ctx)), own);
      }
  }
}

TEST(FluxModulation, BadRowsAndShapesAreNamedErrors) {
  const Stream s = ops::default_op_stream();
  const auto& model = tiny("transformer");
  const auto& plain = tiny("transformer_noguidance");
  const Tensor pooled = random_tensor({2, 24}, 3, DType::f32, 1.0f);
  const Tensor t = vector_of({0.5f, 0.5f}), g = vector_of({3.5f, 3.5f});
  EXPECT_NE(message_of([&] {
              model.modulation(t, g, random_tensor({3, 24}, 3, DType::f32, 1.0f), s);
            }).find("flux modulation: pooled_projections must be [2, 24] (a row per timestep), got [3, 24]"),
            std::string::npos);
  EXPECT_NE(message_of([&] { model.modulation(t, Tensor(), pooled, s); }).find("guidance must be [2] (a row per timestep), got nothing"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              plain.modulation(t, g, random_tensor({2, 20}, 3, DType::f32, 1.0f), s);
            }).find("no guidance embedder"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              model.modulation(Tensor::zeros({2, 1}, DType::f32), g, pooled, s);
            }).find("flux modulation: timestep must be [R] with R >= 1, got [2, 1]"),
            std::string::npos);
  EXPECT_NE(message_of([&] { model.modulation(Tensor::zeros({2}, DType::i32), g, pooled, s); }).find("timestep must be f32, bf16 or i64"),
            std::string::npos);

  const models::FluxModulation table = model.modulation(t, g, pooled, s);
  EXPECT_NE(message_of([&] { table.slice(1, 2); }).find("2 row(s) from row 1 are outside its 2 rows"), std::string::npos);
  models::FluxInputs in = inputs(model, 1, 0.5f);
  in.modulation = std::make_shared<const models::FluxModulation>(table);  // 2 rows for a batch of 1
  EXPECT_NE(message_of([&] { model.forward(in, s); }).find("the precomputed modulation's blocks[0] must be f32 [1, 192]"),
            std::string::npos)
      << message_of([&] { model.forward(in, s); });
  models::FluxModulation other = table.slice(0, 1);
  other.blocks.pop_back();
  in.modulation = std::make_shared<const models::FluxModulation>(other);
  EXPECT_NE(message_of([&] { model.forward(in, s); }).find("has 3 block and 2 context entries; this model has 4 blocks, 2 of them double"),
            std::string::npos)
      << message_of([&] { model.forward(in, s); });
  // Slices that would overflow, and non-finite timesteps and guidance, are named.
  EXPECT_NE(message_of([&] { table.slice(1, INT64_MAX); }).find("are outside its 2 rows"), std::string::npos);
  EXPECT_NE(message_of([&] { models::FluxModulation().slice(0, 0); }).find("the table is empty"), std::string::npos);
  EXPECT_NE(message_of([&] {
              model.modulation(vector_of({0.5f, NAN}), g, pooled, s);
            }).find("flux modulation: timestep holds nan at element 1 of [2]; expected finite values (the model multiplies them by 1000)"),
            std::string::npos)
      << message_of([&] {
           model.modulation(vector_of({0.5f, NAN}), g, pooled, s);
         });
  EXPECT_NE(message_of([&] { model.modulation(t, vector_of({3e38f, 1.0f}), pooled, s); }).find("guidance holds"), std::string::npos);
  models::FluxInputs infinite = inputs(model, 1, INFINITY);
  EXPECT_NE(message_of([&] { model.forward(infinite, s); }).find("flux forward: timestep holds inf"), std::string::npos);
  // A table made for bf16 activations, or another model's, is refused by dtype and width.
  models::FluxModulation bf16 = model.modulation(t, g, pooled, s, DType::bf16).slice(0, 1);
  in.modulation = std::make_shared<const models::FluxModulation>(bf16);
  EXPECT_NE(message_of([&] { model.forward(in, s); })
                .find("the precomputed modulation's blocks[0] must be f32 [1, 192] (this model's modulation in the activations' dtype), "
                      "got bf16 [1, 192]"),
            std::string::npos)
      << message_of([&] { model.forward(in, s); });
  models::FluxModulation narrow = table.slice(0, 1);
  narrow.out = narrow.out.narrow(1, 0, 8);
  in.modulation = std::make_shared<const models::FluxModulation>(narrow);
  EXPECT_NE(message_of([&] { model.forward(in, s); }).find("modulation's out must be f32 [1, 64]"), std::string::npos)
      << message_of([&] { model.forward(in, s); });
}

LoopRun denoise(const pipelines::FluxT2IPipeline& pipeline, bool streaming, DType act, pipelines::CfgMode cfg) {
  const pipelines::PromptEmbeddings pos{random_tensor({1, 5, 40}, 1, DType::f32, 1.0f), random_tensor({1, 24}, 2, DType::f32, 1.0f)};
  const pipelines::PromptEmbeddings neg{random_tensor({1, 5, 40}, 3, DType::f32, 1.0f), random_tensor({1, 24}, 4, DType::f32, 1.0f)};
  pipelines::T2IOptions o;
  o.width = o.height = 32;
  o.steps = 4;
  o.cfg = cfg;
  o.activations = act;
  o.seed = 5;
  return run_denoising(pipeline, o, pos, cfg == pipelines::CfgMode::off ? nullptr : &neg, streaming);
}

TEST(FluxModulation, TheLoopComputesItOnceForAllStepsWithTheSameLatents) {
  const pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(data_path("flux_tiny"));
  const int blocks = pipeline.transformer().block_count();
  for (const DType act : {DType::f32, DType::bf16})
    for (const pipelines::CfgMode cfg : {pipelines::CfgMode::off, pipelines::CfgMode::fused, pipelines::CfgMode::streams}) {
      SCOPED_TRACE(std::string(dtype_name(act)) + " cfg " + std::string(pipelines::cfg_mode_name(cfg)));
      denoise(pipeline, true, act, cfg);  // a shape's first calls tune its kernels: not counted
      const LoopRun table = denoise(pipeline, false, act, cfg), per_step = denoise(pipeline, true, act, cfg);
      expect_close_rel(table.latents, per_step.latents, 0, "latents");
      // Steps 2 to 4 run none of the blocks' modulation Linears or norm_out's (per forward).
      EXPECT_GE(per_step.kernels, table.kernels + 3u * static_cast<uint64_t>(blocks + 1)) << per_step.kernels << " " << table.kernels;
    }
}

// A LinearKernel that is the float GEMM under another name (as a quantized layer would sit there).
class RenamedKernel : public models::LinearKernel {
 public:
  std::string name() const override { return "renamed"; }
  Tensor forward(const models::Linear& layer, const Tensor& x, const Stream& s, const ops::MatmulOptions& epilogue) const override {
    return layer.float_forward(x, s, epilogue);
  }
  std::size_t weight_bytes() const override { return 0; }
};

TEST(FluxModulation, AQuantizedModulationLinearKeepsItPerStep) {
  pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(data_path("flux_tiny"));
  EXPECT_TRUE(pipeline.transformer().modulation_is_plain());
  denoise(pipeline, false, DType::f32, pipelines::CfgMode::off);  // first calls tune kernels: not counted
  const uint64_t with_table = denoise(pipeline, false, DType::f32, pipelines::CfgMode::off).kernels;
  auto& model = pipeline.mutable_transformer();
  model.mutable_parameters().linear(model.single_blocks().back().prefix + ".norm.linear").kernel = std::make_shared<RenamedKernel>();
  EXPECT_FALSE(model.modulation_is_plain());
  const uint64_t per_step = denoise(pipeline, false, DType::f32, pipelines::CfgMode::off).kernels;
  EXPECT_GE(per_step, with_table + 3u * static_cast<uint64_t>(model.block_count() + 1));
}

}  // namespace flux_modulation_test
}  // namespace cubevec
