// The plug points, seen by a stage that records everything it is shown, on the tiny Flux and Wan
// checkpoints: block order and names (one flat index: Flux's double blocks, then its single
// blocks), attention identities (kind, text length, latent grid, module), step info (index,
// count, timestep, sigma, CFG branch per guidance mode); the layer registry; and the shared loop
// against a plain loop written here (bit for bit).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "models/flux_transformer.h"
#include "models/wan_transformer.h"
#include "ops/vector_ops.h"
#include "pipelines/flux_t2i.h"
#include "pipelines/noise.h"
#include "pipelines/wan_t2v.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace plug_points_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using models::AttentionKind;
using models::CfgBranch;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

struct SeenStep {
  models::StepInfo step;
};
struct SeenBlock {
  models::StepInfo step;
  models::BlockIdentity id;
  Shape hidden, encoder;
};
struct SeenAttention {
  models::StepInfo step;
  models::AttentionIdentity id;
  Shape q, k;
};

// Records every call and changes nothing.
class RecordingStage : public pipelines::Stage {
 public:
  std::string name() const override { return "recorder"; }
  void begin_run(const pipelines::RunInfo& run) override { runs.push_back(run); }
  void before_step(const models::StepInfo& step) override { steps.push_back({step}); }
  bool uses_attention() const override { return true; }
  Tensor attend(const models::StepInfo& step, const models::AttentionIdentity& id, const models::AttentionProjection& project,
                const Stream& /*stream*/, const pipelines::AttendNext& next) override {
    const models::AttentionQkv qkv = project();
    attention.push_back({step, id, qkv.q.shape(), qkv.k.shape()});
    return next([qkv] { return qkv; });
  }
  bool uses_blocks() const override { return true; }
  models::BlockState run_block(const models::StepInfo& step, const models::BlockIdentity& id, const models::BlockState& in,
                               const models::BlockCompute& compute, const Stream& /*stream*/) override {
    blocks.push_back({step, id, in.hidden.shape(), in.encoder.defined() ? in.encoder.shape() : Shape{}});
    return compute(in);
  }
  std::vector<pipelines::RunInfo> runs;
  std::vector<SeenStep> steps;
  std::vector<SeenBlock> blocks;
  std::vector<SeenAttention> attention;
};

pipelines::PromptEmbeddings flux_prompt(int64_t length, unsigned seed) {
  return {random_tensor({1, length, 40}, seed, DType::f32, 1.0f), random_tensor({1, 24}, seed + 1, DType::f32, 1.0f)};
}

TEST(PlugPoints, FluxBlocksAttentionAndSteps) {
  const pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(data_path("flux_tiny"));
  const auto& model = pipeline.transformer();
  const int blocks = model.block_count();
  ASSERT_EQ(blocks, static_cast<int>(model.double_blocks().size() + model.single_blocks().size()));
  const pipelines::PromptEmbeddings pos = flux_prompt(5, 1), neg = flux_prompt(5, 3);
  for (pipelines::CfgMode mode : {pipelines::CfgMode::off, pipelines::CfgMode::fused, pipelines::CfgMode::streams}) {
    SCOPED_TRACE(std::string(pipelines::cfg_mode_name(mode)));
    pipelines::StageList stages;
    auto recorder = std::make_unique<RecordingStage>();
    RecordingStage& seen = *recorder;
    stages.add(std::move(recorder));
    pipelines::T2IOptions o;
    o.width = 24, o.height = 16;  // the tiny VAE upsamples 4x: latent 6 x 4, packed 3 x 2 tokens
    o.steps = 3;
    o.cfg = mode;
    Device device(builtin_cpu_profile());
    pipelines::T2ITimings timings;
    pipeline.denoise(pos, mode == pipelines::CfgMode::off ? nullptr : &neg, o, device, {}, timings, &stages);

    pipelines::FlowMatchEulerScheduler scheduler(pipeline.scheduler_config());
    scheduler.set_flux_timesteps(3, 6);
    ASSERT_EQ(seen.runs.size(), 1u);
    EXPECT_EQ(seen.runs[0].steps, 3);
    EXPECT_EQ(seen.runs[0].blocks, blocks);
    ASSERT_EQ(seen.steps.size(), 3u);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(seen.steps[static_cast<std::size_t>(i)].step.index, i);
      EXPECT_EQ(seen.steps[static_cast<std::size_t>(i)].step.count, 3);
      EXPECT_EQ(seen.steps[static_cast<std::size_t>(i)].step.timestep, scheduler.timesteps()[static_cast<std::size_t>(i)]);
      EXPECT_EQ(seen.steps[static_cast<std::size_t>(i)].step.sigma, scheduler.sigmas()[static_cast<std::size_t>(i)]);
    }
    // Branches per forward: off one cond forward; fused one forward of both; streams uncond then cond.
    const std::vector<CfgBranch> branches = mode == pipelines::CfgMode::off     ? std::vector{CfgBranch::cond}
                                            : mode == pipelines::CfgMode::fused ? std::vector{CfgBranch::both}
                                                                                : std::vector{CfgBranch::uncond, CfgBranch::cond};
    const int64_t batch = mode == pipelines::CfgMode::fused ? 2 : 1;
    ASSERT_EQ(seen.blocks.size(), 3 * branches.size() * static_cast<std::size_t>(blocks));
    std::size_t k = 0;
    for (int step = 0; step < 3; ++step)
      for (CfgBranch branch : branches)
        for (int b = 0; b < blocks; ++b, ++k) {
          const SeenBlock& sb = seen.blocks[k];
          EXPECT_EQ(sb.step.index, step);
          EXPECT_EQ(sb.step.branch, branch);
          EXPECT_EQ(sb.id.index, b);
          EXPECT_EQ(sb.id.count, blocks);
          const auto doubles = static_cast<int>(model.double_blocks().size());
          EXPECT_EQ(sb.id.module,
                    b < doubles ? "transformer_blocks." + std::to_string(b) : "single_transformer_blocks." + std::to_string(b - doubles));
          EXPECT_EQ(sb.hidden, (Shape{batch, 6, 32}));
          EXPECT_EQ(sb.encoder, (Shape{batch, 5, 32}));
        }
    // One joint attention per block, in block order, over [text; image] with the image grid.
    ASSERT_EQ(seen.attention.size(), seen.blocks.size());
    for (std::size_t i = 0; i < seen.attention.size(); ++i) {
      const SeenAttention& a = seen.attention[i];
      EXPECT_EQ(a.id.block, seen.blocks[i].id.index);
      EXPECT_EQ(a.id.blocks, blocks);
      EXPECT_EQ(a.id.kind, AttentionKind::joint);
      EXPECT_EQ(a.id.text_len, 5);
      EXPECT_EQ(a.id.grid, (std::array<int64_t, 3>{1, 2, 3}));
      EXPECT_EQ(a.id.module, seen.blocks[i].id.module + ".attn");
      EXPECT_EQ(a.step.branch, seen.blocks[i].step.branch);
      EXPECT_EQ(a.q, (Shape{batch, 11, model.config().num_attention_heads, model.config().attention_head_dim}));
    }
    // The counts of a recording stage: everything computed.
    ASSERT_EQ(stages.step_counts().size(), 3u);
    for (const auto& c : stages.step_counts()) {
      EXPECT_EQ(c.block_calls, c.blocks_computed);
      EXPECT_EQ(c.block_calls, static_cast<int>(branches.size()) * blocks);
      EXPECT_EQ(c.attention_calls, c.attention_computed);
    }
  }
}

TEST(PlugPoints, WanBlocksAndSelfThenCrossAttention) {
  const pipelines::WanT2VPipeline pipeline = pipelines::WanT2VPipeline::load(data_path("wan_tiny"));
  const int blocks = pipeline.transformer().block_count();
  pipelines::StageList stages;
  auto recorder = std::make_unique<RecordingStage>();
  RecordingStage& seen = *recorder;
  stages.add(std::move(recorder));
  pipelines::T2VOptions o;
  o.width = 48, o.height = 32, o.frames = 5;  // latent 2 x 4 x 6, patch grid 2 x 2 x 3
  o.steps = 2;
  o.cfg = pipelines::CfgMode::off;
  Device device(builtin_cpu_profile());
  pipelines::T2ITimings timings;
  pipeline.denoise({random_tensor({1, 7, 24}, 5, DType::f32, 1.0f), {}}, nullptr, o, device, {}, timings, &stages);
  ASSERT_EQ(seen.blocks.size(), 2u * static_cast<std::size_t>(blocks));
  ASSERT_EQ(seen.attention.size(), 2 * seen.blocks.size());
  for (std::size_t i = 0; i < seen.blocks.size(); ++i) {
    EXPECT_EQ(seen.blocks[i].id.module, "blocks." + std::to_string(i % static_cast<std::size_t>(blocks)));
    EXPECT_EQ(seen.blocks[i].hidden, (Shape{1, 12, 32}));
    EXPECT_EQ(seen.blocks[i].encoder, Shape{});
    const SeenAttention &self = seen.attention[2 * i], &cross = seen.attention[2 * i + 1];
    EXPECT_EQ(self.id.kind, AttentionKind::self);
    EXPECT_EQ(self.id.module, seen.blocks[i].id.module + ".attn1");
    EXPECT_EQ(self.id.grid, (std::array<int64_t, 3>{2, 2, 3}));
    EXPECT_EQ(self.id.text_len, 0);
    EXPECT_EQ(cross.id.kind, AttentionKind::cross);
    EXPECT_EQ(cross.id.module, seen.blocks[i].id.module + ".attn2");
    EXPECT_EQ(cross.id.text_len, 7);
    EXPECT_EQ(cross.q, (Shape{1, 12, 2, 16}));
    EXPECT_EQ(cross.k, (Shape{1, 7, 2, 16}));
  }
}

// A Linear kernel that runs the float GEMM and scales the result: proves the swap reaches the forward.
class ScaledKernel : public models::LinearKernel {
 public:
  explicit ScaledKernel(float factor) : factor_(factor) {}
  std::string name() const override { return "scaled"; }
  Tensor forward(const models::Linear& layer, const Tensor& x, const Stream& s, const ops::MatmulOptions& epilogue) const override {
    const Tensor y = layer.float_forward(x, s, epilogue);
    return ops::mul(y, Tensor::from_vector(std::vector<float>{factor_}, {1}), s);
  }
  std::size_t weight_bytes() const override { return 0; }

 private:
  float factor_;
};

TEST(PlugPoints, LayerRegistryReachesEveryLinearByItsDiffusersName) {
  auto model = models::FluxTransformer2DModel::load(data_path("flux_tiny/transformer"));
  models::ParameterTable& table = model->mutable_parameters();
  // Every declared ".weight" of a 2-D tensor except the norms belongs to a registered Linear.
  std::size_t matrices = 0;
  for (const auto& spec : table.specs())
    if (spec.shape.size() == 2 && spec.name.ends_with(".weight")) {
      ++matrices;
      const std::string module = spec.name.substr(0, spec.name.size() - 7);
      EXPECT_EQ(table.linear(module).weight.shape(), spec.shape) << module;
      EXPECT_EQ(table.linear(module).name, module);
    }
  EXPECT_EQ(table.linears().size(), matrices);
  EXPECT_EQ(&table.linear("transformer_blocks.0.attn.to_q"), &model->double_blocks()[0].to_q);
  EXPECT_NE(message_of([&] { table.linear("transformer_blocks.0.attn.to_qq"); }).find("the closest is 'transformer_blocks.0.attn.to_q"),
            std::string::npos);

  const Tensor x = random_tensor({2, 3, 32}, 9, DType::f32, 1.0f);
  models::Linear& layer = table.linear("single_transformer_blocks.0.attn.to_k");
  const Tensor plain = layer(x, ops::default_op_stream());
  layer.kernel = std::make_shared<ScaledKernel>(2.0f);
  const Tensor swapped = layer(x, ops::default_op_stream());
  const std::vector<double> p = values(plain), q = values(swapped);
  for (std::size_t i = 0; i < p.size(); ++i) ASSERT_EQ(q[i], static_cast<double>(static_cast<float>(2 * p[i]))) << i;
}

// The shared loop against a plain one written here from the pipelines' definitions: the same latents, bit for bit.
TEST(SharedLoop, FluxEqualsAPlainLoopBitForBit) {
  const pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(data_path("flux_tiny"));
  const auto& model = pipeline.transformer();
  const pipelines::PromptEmbeddings pos = flux_prompt(5, 1), neg = flux_prompt(5, 3);
  Device device(builtin_cpu_profile());
  const Stream s = device.default_stream();
  for (pipelines::CfgMode mode : {pipelines::CfgMode::off, pipelines::CfgMode::fused}) {
    pipelines::T2IOptions o;
    o.width = o.height = 32;
    o.steps = 4;
    o.cfg = mode;
    o.seed = 7;
    pipelines::T2ITimings timings;
    const Tensor got = pipeline.denoise(pos, mode == pipelines::CfgMode::off ? nullptr : &neg, o, device, {}, timings);

    Tensor x = models::pack_latents(pipelines::gaussian_noise({1, 16, 8, 8}, 7), s);  // the tiny VAE upsamples 4x
    pipelines::FlowMatchEulerScheduler scheduler(pipeline.scheduler_config());
    scheduler.set_flux_timesteps(4, 16);
    for (int i = 0; i < 4; ++i) {
      const float t = scheduler.timesteps()[static_cast<std::size_t>(i)] / 1000.0f;
      const int batch = mode == pipelines::CfgMode::fused ? 2 : 1;
      models::FluxInputs in;
      in.img_ids = models::flux_image_ids(8, 8);
      in.txt_ids = Tensor::zeros({5, 3}, DType::f32);
      in.hidden_states = batch == 2 ? ops::concat({x, x}, 0, s) : x;
      in.encoder_hidden_states = batch == 2 ? ops::concat({pos.sequence, neg.sequence}, 0, s) : pos.sequence;
      in.pooled_projections = batch == 2 ? ops::concat({pos.pooled, neg.pooled}, 0, s) : pos.pooled;
      in.timestep = Tensor::from_vector(std::vector<float>(static_cast<std::size_t>(batch), t), {batch});
      in.guidance = Tensor::from_vector(std::vector<float>(static_cast<std::size_t>(batch), 3.5f), {batch});
      Tensor v = model.forward(in, s);
      if (batch == 2) {
        const Tensor vu = ops::contiguous(v.narrow(0, 1, 1), s);
        v = ops::muls_add(ops::sub(v.narrow(0, 0, 1), vu, s), vu, static_cast<float>(o.cfg_scale), s);
      }
      x = scheduler.step(v, x, s);
    }
    const std::vector<double> a = values(got), b = values(x);
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "element " << i << " cfg " << pipelines::cfg_mode_name(mode);
  }
}

TEST(SharedLoop, WanEqualsAPlainLoopBitForBit) {
  const pipelines::WanT2VPipeline pipeline = pipelines::WanT2VPipeline::load(data_path("wan_tiny"));
  const Tensor pos = random_tensor({1, 7, 24}, 5, DType::f32, 1.0f), neg = random_tensor({1, 7, 24}, 6, DType::f32, 1.0f);
  Device device(builtin_cpu_profile());
  const Stream s = device.default_stream();
  pipelines::T2VOptions o;
  o.width = 32, o.height = 32, o.frames = 5;
  o.steps = 3;
  o.cfg = pipelines::CfgMode::fused;
  o.guidance = 4.0;
  o.seed = 11;
  pipelines::T2ITimings timings;
  const pipelines::PromptEmbeddings neg_e{neg, {}};
  const Tensor got = pipeline.denoise({pos, {}}, &neg_e, o, device, {}, timings);

  Tensor x = pipelines::gaussian_noise({1, 4, 2, 4, 4}, 11);
  const std::unique_ptr<pipelines::Scheduler> scheduler = pipelines::make_scheduler(pipeline.scheduler_config(), 3);
  const Tensor text = ops::concat({pos, neg}, 0, s);
  for (int i = 0; i < 3; ++i) {
    const float t = scheduler->timesteps()[static_cast<std::size_t>(i)];
    const Tensor both =
        pipeline.transformer().forward({ops::concat({x, x}, 0, s), Tensor::from_vector(std::vector<float>{t, t}, {2}), text}, s);
    const Tensor vu = ops::contiguous(both.narrow(0, 1, 1), s);
    x = scheduler->step(ops::muls_add(ops::sub(both.narrow(0, 0, 1), vu, s), vu, 4.0f, s), x, s);
  }
  const std::vector<double> a = values(got), b = values(x);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "element " << i;
}

TEST(PlugPoints, RopeTablesAreBuiltOncePerShape) {
  const auto model = models::WanTransformer3DModel::load(data_path("wan_tiny/transformer"));
  const Stream s = ops::default_op_stream();
  const Tensor text = random_tensor({1, 7, 24}, 1, DType::f32, 1.0f);
  for (int i = 0; i < 3; ++i)
    model->forward({random_tensor({1, 4, 2, 4, 6}, 2), Tensor::from_vector(std::vector<float>{500}, {1}), text}, s);
  EXPECT_EQ(model->rope_cache().builds(), 1u);
  model->forward({random_tensor({1, 4, 1, 4, 4}, 2), Tensor::from_vector(std::vector<float>{500}, {1}), text}, s);
  EXPECT_EQ(model->rope_cache().builds(), 2u);
}

}  // namespace plug_points_test
}  // namespace cubevec
