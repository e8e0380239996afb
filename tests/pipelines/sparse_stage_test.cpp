// The sparse attention stage on the tiny Wan checkpoint: dense before step_start and outside the
// chosen blocks, masks estimated only on refresh steps and reused between them (the output of a
// reusing step equals the attention computed with the mask of the last refresh step), sparsity 0
// matching the dense run, cross-attention untouched, the per-step kept fraction, and the setting
// errors.
#include <gtest/gtest.h>

#include "ops/sparse_attention.h"
#include "pipelines/stages/sparse_attention.h"
#include "pipelines/wan_t2v.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace sparse_stage_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

// Latent 3 x 16 x 32 -> a 3 x 8 x 16 token grid: 384 tokens, 3 key blocks of 128.
pipelines::T2VOptions options(int steps) {
  pipelines::T2VOptions o;
  o.width = 256, o.height = 128, o.frames = 9, o.steps = steps, o.cfg = pipelines::CfgMode::off;
  return o;
}

// Sees what reaches the attention after the stages before it.
class Recorder : public pipelines::Stage {
 public:
  std::string name() const override { return "recorder"; }
  bool uses_attention() const override { return true; }
  Tensor attend(const models::StepInfo& step, const models::AttentionIdentity& id, const models::AttentionProjection& project,
                const Stream& /*stream*/, const pipelines::AttendNext& next) override {
    calls.push_back({step.index, id.kind});
    return next(project);
  }
  std::vector<std::pair<int, models::AttentionKind>> calls;
};

// Placed before the sparse stage: hands it the module's q, k, v and checks its output against the
// attention computed here with a mask this checker estimated itself on the last refresh step.
class ReuseChecker : public pipelines::Stage {
 public:
  std::string name() const override { return "reuse checker"; }
  bool uses_attention() const override { return true; }
  Tensor attend(const models::StepInfo& step, const models::AttentionIdentity& id, const models::AttentionProjection& project,
                const Stream& stream, const pipelines::AttendNext& next) override {
    if (id.kind != models::AttentionKind::self || id.block != 1 || step.index < 1) return next(project);
    const models::AttentionQkv qkv = project();
    const Tensor out = next([qkv] { return qkv; });
    ops::SparseAttentionOptions o;
    o.sparse_type = ops::SparseType::rf_v2;
    o.sparsity = 0.5;
    o.latent_shape_q = id.grid;
    o.input_layout = ops::AttentionLayout::bsnd;
    if (step.index % 2 == 1) mask = ops::estimate_sparse_mask(qkv.q, qkv.k, o, stream);  // the refresh steps
    const Tensor want = ops::sparse_attention_with_mask(qkv.q, qkv.k, qkv.v, mask, o, stream);
    const std::vector<double> a = values(out), b = values(want);
    identical.push_back(a == b);
    return out;
  }
  ops::SparseMask mask;
  std::vector<bool> identical;
};

double max_rel_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = values(a), y = values(b);
  double m = 0, scale = 0;
  for (std::size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i])), scale = std::max(scale, std::abs(y[i]));
  return m / scale;
}

TEST(SparseStage, MasksAreEstimatedOnRefreshStepsOnly) {
  const pipelines::WanT2VPipeline pipeline = pipelines::WanT2VPipeline::load(data_path("wan_tiny"));
  const pipelines::PromptEmbeddings prompt{random_tensor({1, 7, 24}, 5, DType::f32, 1.0f), {}};
  pipelines::SparseConfig c;
  c.type = ops::SparseType::rf_v2;
  c.sparsity = 0.5;
  c.step_start = 1;
  c.mask_refresh = 2;
  c.block_first = c.block_last = 1;  // the second of the two blocks
  pipelines::StageList stages;
  auto owner = std::make_unique<pipelines::SparseAttentionStage>(c);
  pipelines::SparseAttentionStage& stage = *owner;
  auto checker_owner = std::make_unique<ReuseChecker>();
  ReuseChecker& checker = *checker_owner;
  stages.add(std::move(checker_owner));
  stages.add(std::move(owner));
  Device device(builtin_cpu_profile());
  pipelines::T2ITimings timings;
  const Tensor sparse = pipeline.denoise(prompt, nullptr, options(6), device, {}, timings, &stages);
  EXPECT_EQ(checker.identical, (std::vector<bool>(5, true))) << "steps 2 and 4 must use the masks of steps 1 and 3";
  // Refresh steps 1, 3, 5; one module (block 1's self-attention) sparse.
  EXPECT_EQ(stage.estimates_per_step(), (std::vector<int>{0, 1, 0, 1, 0, 1}));
  for (int s : {1, 3, 5}) EXPECT_TRUE(stage.refreshes(s)) << s;
  for (int s : {0, 2, 4}) EXPECT_FALSE(stage.refreshes(s)) << s;
  const std::vector<double> kept = stage.kept_fraction_per_step();
  ASSERT_EQ(kept.size(), 6u);
  EXPECT_EQ(kept[0], -1.0);     // dense
  EXPECT_EQ(kept[1], kept[2]);  // step 2 reuses step 1's mask
  for (int s = 1; s < 6; ++s) {
    EXPECT_GT(kept[static_cast<std::size_t>(s)], 0.0);
    EXPECT_LE(kept[static_cast<std::size_t>(s)], 1.0);
  }
  EXPECT_EQ(stage.report()["kept_fraction_per_step"].size(), 6u);

  // Sparsity 0 through the stage is the dense run (the block-sparse path with every block kept).
  pipelines::StageList dense_stages;
  c.sparsity = 0.0;
  dense_stages.add(std::make_unique<pipelines::SparseAttentionStage>(c));
  const Tensor zero = pipeline.denoise(prompt, nullptr, options(6), device, {}, timings, &dense_stages);
  const Tensor dense = pipeline.denoise(prompt, nullptr, options(6), device, {}, timings, nullptr);
  EXPECT_LT(max_rel_diff(zero, dense), 1e-5);
  EXPECT_GT(max_rel_diff(sparse, dense), 1e-6) << "sparsity 0.5 must change something";
}

TEST(SparseStage, CrossAttentionAndEarlyStepsStayDense) {
  const pipelines::WanT2VPipeline pipeline = pipelines::WanT2VPipeline::load(data_path("wan_tiny"));
  const pipelines::PromptEmbeddings prompt{random_tensor({1, 7, 24}, 5, DType::f32, 1.0f), {}};
  pipelines::SparseConfig c;
  c.type = ops::SparseType::ada_bsa;
  c.sparsity = 0.5;
  c.step_start = 2;
  pipelines::StageList stages;
  auto sparse = std::make_unique<pipelines::SparseAttentionStage>(c);
  pipelines::SparseAttentionStage& stage = *sparse;
  auto recorder = std::make_unique<Recorder>();
  Recorder& seen = *recorder;
  stages.add(std::move(sparse));
  stages.add(std::move(recorder));  // after the sparse stage: sees only what it passes on
  Device device(builtin_cpu_profile());
  pipelines::T2ITimings timings;
  pipeline.denoise(prompt, nullptr, options(4), device, {}, timings, &stages);
  int self_before = 0, self_after = 0, cross = 0;
  for (const auto& [step, kind] : seen.calls) {
    if (kind == models::AttentionKind::cross) ++cross;
    else if (step < 2) ++self_before;
    else ++self_after;
  }
  EXPECT_EQ(cross, 4 * 2);        // every step, both blocks
  EXPECT_EQ(self_before, 2 * 2);  // dense steps 0 and 1
  EXPECT_EQ(self_after, 0);       // taken by the sparse stage
  EXPECT_EQ(stage.estimates(), 2 * 2);
}

TEST(SparseStage, SettingErrorsNameTheFlag) {
  const auto error = [](auto edit) {
    pipelines::SparseConfig c;
    c.type = ops::SparseType::rf_v2;
    edit(c);
    return message_of([&] { pipelines::SparseAttentionStage stage(c); });
  };
  EXPECT_NE(error([](auto& c) { c.sparsity = -0.1; }).find("--sparsity must be in [0, 1], got -0.1"), std::string::npos);
  EXPECT_NE(error([](auto& c) { c.sparsity = 1.0; }).find("--sparsity must be below 1 for rf_v2"), std::string::npos);
  EXPECT_NE(error([](auto& c) { c.mask_refresh = 0; }).find("--sparse-mask-refresh must be >= 1"), std::string::npos);
  EXPECT_NE(error([](auto& c) { c.step_start = -3; }).find("--sparse-step-start must be >= 0, got -3"), std::string::npos);
  EXPECT_NE(error([](auto& c) { c.cdf_threshold = 2; }).find("--sparse-cdf-threshold must be in (0, 1], got 2"), std::string::npos);
  EXPECT_NE(message_of([] { pipelines::SparseConfig::parse_blocks("3"); }).find("--sparse-blocks must be A-B"), std::string::npos);
  EXPECT_NE(message_of([] { pipelines::SparseConfig::parse_blocks("5-2"); }).find("the last block comes before the first"),
            std::string::npos);
  EXPECT_NE(message_of([] { pipelines::SparseConfig::parse_blocks("a-b"); }).find("got 'a-b'"), std::string::npos);
  EXPECT_EQ(pipelines::SparseConfig::parse_blocks("2-37"), (std::pair<int, int>{2, 37}));
  pipelines::SparseConfig c;
  c.type = ops::SparseType::rf_v2;
  c.block_first = 1, c.block_last = 9;
  pipelines::SparseAttentionStage stage(c);
  pipelines::RunInfo run;
  run.steps = 4, run.blocks = 2;
  EXPECT_NE(message_of([&] { stage.begin_run(run); }).find("--sparse-blocks 1-9 must lie in 0-1 (this model has 2 blocks)"),
            std::string::npos);
}

}  // namespace sparse_stage_test
}  // namespace cubevec
