// The step caches: MindIE SD's validation, bypass and step rules (from mindiesd/cache_agent/*.py),
// bit-identical output when every step is computed, DiTBlockCache's replay against a replay
// computed by hand on the tiny Flux model, cache-dit's DBCache decisions on constructed residual
// sequences, TaylorSeer against closed-form values, and the config file.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "models/flux_transformer.h"
#include "ops/vector_ops.h"
#include "pipelines/flux_t2i.h"
#include "pipelines/stages/attention_cache.h"
#include "pipelines/stages/cache_config.h"
#include "pipelines/stages/db_cache.h"
#include "pipelines/stages/dit_block_cache.h"
#include "pipelines/stages/taylorseer.h"

#include "common/temp_dir.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace step_cache_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using pipelines::CacheConfig;
using pipelines::CacheMethod;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

CacheConfig mindie(CacheMethod method, int start, int interval, std::optional<int> step_end = {}, int block_start = 0,
                   std::optional<int> block_end = {}) {
  CacheConfig c;
  c.method = method;
  c.step_start = start;
  c.step_interval = interval;
  c.step_end = step_end;
  c.block_start = block_start;
  c.block_end = block_end;
  return c;
}

TEST(StepCacheConfig, MindieValidationRules) {
  const auto error = [](const CacheConfig& c) { return message_of([&] { c.validate(50, 30); }); };
  EXPECT_NE(error(mindie(CacheMethod::dit_block, -1, 2)).find("--cache-step-start must be >= 0, got -1"), std::string::npos);
  EXPECT_NE(error(mindie(CacheMethod::attention, 0, 0)).find("--cache-interval must be > 0, got 0"), std::string::npos);
  EXPECT_NE(error(mindie(CacheMethod::attention, 0, 2, {}, -3)).find("--cache-block-start must be >= 0"), std::string::npos);
  EXPECT_NE(error(mindie(CacheMethod::attention, 10, 2, 5)).find("--cache-step-end must be >= --cache-step-start 10, got 5"),
            std::string::npos);
  EXPECT_NE(error(mindie(CacheMethod::dit_block, 0, 2, {}, 5, 4)).find("--cache-block-end must be >= --cache-block-start 5, got 4"),
            std::string::npos);
  // dit-block's span must fit the model; attention's block range is not checked against it (MindIE).
  EXPECT_NE(error(mindie(CacheMethod::dit_block, 0, 2, {}, 5, 31)).find("--cache-block-end must be in [5, 30]"), std::string::npos);
  EXPECT_EQ(error(mindie(CacheMethod::attention, 0, 2, {}, 5, 31)), "(no error)");
  EXPECT_EQ(error(mindie(CacheMethod::dit_block, 10, 3, 35, 10, 30)), "(no error)");
}

TEST(StepCacheConfig, MindieBypassRules) {
  const auto bypass = [](const CacheConfig& c) { return c.bypass_reason(50, 30).value_or(""); };
  EXPECT_NE(bypass(mindie(CacheMethod::attention, 50, 2)).find("--cache-step-start 50 >= the 50 steps"), std::string::npos);
  EXPECT_NE(bypass(mindie(CacheMethod::attention, 10, 2, 10)).find("--cache-step-end equals --cache-step-start"), std::string::npos);
  EXPECT_NE(bypass(mindie(CacheMethod::dit_block, 0, 2, {}, 30, 30)).find("--cache-block-start 30 >= the 30 blocks"), std::string::npos);
  EXPECT_NE(bypass(mindie(CacheMethod::dit_block, 0, 2, {}, 4, 4)).find("--cache-block-end equals --cache-block-start"), std::string::npos);
  EXPECT_NE(bypass(mindie(CacheMethod::attention, 0, 1)).find("--cache-interval 1"), std::string::npos);
  EXPECT_EQ(bypass(mindie(CacheMethod::attention, 20, 2, 47)), "");
}

TEST(StepCacheConfig, MindieStepRules) {
  // attention: reuse when step_start < s <= step_end and (s - step_start) % interval != 0; store when
  // step_start <= s < step_end (MindIE's AttentionCache.apply_imp), here for Wan2.1's 20 / 2 / 47.
  const pipelines::AttentionCacheStage attention(mindie(CacheMethod::attention, 20, 2, 47), 50, 30);
  for (int s = 0; s < 50; ++s) {
    EXPECT_EQ(attention.reuses(s), s > 20 && s <= 47 && (s - 20) % 2 != 0) << s;
    EXPECT_EQ(attention.stores(s), s >= 20 && s < 47) << s;
  }
  // dit-block: compute steps are s >= step_start with (s - step_start) % interval == 0; the span
  // replays on the others from step_start on; step_end is not consulted.
  const pipelines::DiTBlockCacheStage dit(mindie(CacheMethod::dit_block, 10, 3, 35, 10, 20), 60, 30);
  for (int s = 0; s < 60; ++s)
    for (int b = 0; b < 30; ++b) EXPECT_EQ(dit.replays(s, b), s >= 10 && (s - 10) % 3 != 0 && b >= 10 && b < 20) << s << " " << b;
}

TEST(StepCacheConfig, DbValidationAndKeysThatDoNotApply) {
  CacheConfig c;
  c.method = CacheMethod::db;
  c.fn = 0;
  EXPECT_NE(message_of([&] { c.validate(28, 4); }).find("--cache-fn must be in [1, 4]"), std::string::npos);
  c.fn = 2, c.bn = 2;
  EXPECT_NE(message_of([&] { c.validate(28, 4); }).find("--cache-bn must be in [0, 1]"), std::string::npos);
  c.bn = 0, c.threshold = -1;
  EXPECT_NE(message_of([&] { c.validate(28, 4); }).find("--cache-threshold must be a finite number >= 0"), std::string::npos);
  c.threshold = 0.1, c.warmup = 29;
  EXPECT_NE(message_of([&] { c.validate(28, 4); }).find("--cache-warmup must be in [0, 28]"), std::string::npos);
  c.warmup = 2, c.taylorseer = 3;
  EXPECT_NE(message_of([&] { c.validate(28, 4); }).find("--taylorseer must be 1 or 2"), std::string::npos);
  c.taylorseer = 2;
  EXPECT_EQ(message_of([&] { c.validate(28, 4); }), "(no error)");

  const auto json_error = [](const char* text) {
    return message_of([&] { CacheConfig::from_json(nlohmann::json::parse(text), "cache.json"); });
  };
  EXPECT_NE(json_error(R"({"cache": "dit-block", "cache-fn": 2})").find("'cache-fn' does not apply to \"cache\": \"dit-block\""),
            std::string::npos);
  EXPECT_NE(json_error(R"({"cache": "db", "cache-interval": 2})").find("'cache-interval' does not apply"), std::string::npos);
  EXPECT_NE(json_error(R"({"cache": "fast"})").find("'cache' must be one of none, attention, dit-block, db"), std::string::npos);
  EXPECT_NE(json_error(R"({"cache": "db", "cache-treshold": 0.1})").find("unknown key 'cache-treshold'"), std::string::npos);
  EXPECT_NE(json_error(R"({"cache-fn": 1})").find("missing required key 'cache'"), std::string::npos);
  EXPECT_NE(json_error(R"({"cache": "db", "taylorseer": 5})").find("'taylorseer' must be an integer in [0, 2]"), std::string::npos);
  // A written config reads back the same.
  CacheConfig d = mindie(CacheMethod::dit_block, 10, 3, {}, 2, 20);
  const CacheConfig back = CacheConfig::from_json(nlohmann::json::parse(d.to_json().dump()), "x");
  EXPECT_EQ(back.to_json(), d.to_json());
}

// The tiny Flux pipeline's latents with the given stages (none: no stage list).
Tensor flux_latents(const CacheConfig* cache, pipelines::CfgMode mode, int steps) {
  static const pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(data_path("flux_tiny"));
  const pipelines::PromptEmbeddings pos{random_tensor({1, 5, 40}, 1, DType::f32, 1.0f), random_tensor({1, 24}, 2, DType::f32, 1.0f)};
  const pipelines::PromptEmbeddings neg{random_tensor({1, 5, 40}, 3, DType::f32, 1.0f), random_tensor({1, 24}, 4, DType::f32, 1.0f)};
  pipelines::T2IOptions o;
  o.width = o.height = 32;
  o.steps = steps;
  o.cfg = mode;
  o.seed = 3;
  Device device(builtin_cpu_profile());
  pipelines::T2ITimings timings;
  pipelines::StageList stages;
  if (cache) stages.add(pipelines::make_cache_stage(*cache, steps, pipeline.transformer().block_count()));
  return pipeline.denoise(pos, mode == pipelines::CfgMode::off ? nullptr : &neg, o, device, {}, timings, &stages);
}

void expect_identical(const Tensor& a, const Tensor& b, const std::string& what) {
  const std::vector<double> x = values(a), y = values(b);
  ASSERT_EQ(x.size(), y.size()) << what;
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], y[i]) << what << " element " << i;
}

TEST(StepCaches, EveryStepComputedIsBitIdenticalToNoCache) {
  CacheConfig db;
  db.method = CacheMethod::db;
  db.fn = 1, db.threshold = 0.0, db.warmup = 0;  // never caches, but runs its hooks and residuals
  const CacheConfig cases[] = {
      mindie(CacheMethod::dit_block, 3, 2, {}, 1, 3),  // the last step is a compute step: kept, never replayed
      mindie(CacheMethod::attention, 3, 2),            // stores at step 3, reuses nothing
      mindie(CacheMethod::attention, 1, 1),            // bypassed
      db,
  };
  for (pipelines::CfgMode mode : {pipelines::CfgMode::off, pipelines::CfgMode::fused, pipelines::CfgMode::streams}) {
    const Tensor plain = flux_latents(nullptr, mode, 4);
    for (const CacheConfig& c : cases)
      expect_identical(flux_latents(&c, mode, 4), plain,
                       std::string(pipelines::cache_method_name(c.method)) + " cfg " + std::string(pipelines::cfg_mode_name(mode)));
  }
  // A replaying config does change the result (the test above can fail).
  const CacheConfig replaying = mindie(CacheMethod::dit_block, 0, 2, {}, 1, 3);
  const std::vector<double> a = values(flux_latents(&replaying, pipelines::CfgMode::off, 4)),
                            b = values(flux_latents(nullptr, pipelines::CfgMode::off, 4));
  EXPECT_NE(a, b);
}

TEST(StepCaches, DitBlockReplayEqualsAReplayByHand) {
  const auto model = models::FluxTransformer2DModel::load(data_path("flux_tiny/transformer"));
  const Stream s = ops::default_op_stream();
  const int blocks = model->block_count();  // 2 double + 2 single in the tiny model
  ASSERT_GE(blocks, 4);
  const int start = 1, end = 3;  // span over the double/single boundary
  auto inputs = [&](unsigned seed, float t) {
    models::FluxInputs in;
    in.hidden_states = random_tensor({1, 16, 64}, seed, DType::f32, 1.0f);
    in.encoder_hidden_states = random_tensor({1, 5, 40}, seed + 1, DType::f32, 1.0f);
    in.pooled_projections = random_tensor({1, 24}, seed + 2, DType::f32, 1.0f);
    in.timestep = Tensor::from_vector(std::vector<float>{t}, {1});
    in.guidance = Tensor::from_vector(std::vector<float>{3.5f}, {1});
    in.img_ids = models::flux_image_ids(8, 8);
    in.txt_ids = Tensor::zeros({5, 3}, DType::f32);
    return in;
  };
  const models::FluxInputs step0 = inputs(10, 0.9f), step1 = inputs(20, 0.8f);
  pipelines::StageList stages;
  stages.add(std::make_unique<pipelines::DiTBlockCacheStage>(mindie(CacheMethod::dit_block, 0, 2, {}, start, end), 2, blocks));
  stages.begin_run({2, blocks, {models::CfgBranch::cond}, false});
  models::StepInfo info{0, 2, 900, 0.9f, models::CfgBranch::cond};
  stages.before_step(info);
  const Tensor out0 = model->forward(step0, s, stages.context(info, DType::f32));
  info.index = 1;
  stages.before_step(info);
  const Tensor out1 = model->forward(step1, s, stages.context(info, DType::f32));

  // By hand: step 0 computes every block and keeps out(end - 1) - in(start); step 1 computes the
  // blocks before the span, adds that residual, and computes the blocks after it.
  const models::FluxPrologue p0 = model->prologue(step0, {}, s);
  models::BlockState x = p0.state, input;
  for (int b = 0; b < blocks; ++b) {
    if (b == start) input = x;
    x = model->block(b, x, p0.shared, {}, s);
    if (b == end - 1) input = {ops::sub(x.hidden, input.hidden, s), ops::sub(x.encoder, input.encoder, s)};
  }
  expect_identical(out0, model->epilogue(x, p0, s), "computed step");
  const models::BlockState residual = input;
  const models::FluxPrologue p1 = model->prologue(step1, {}, s);
  x = p1.state;
  for (int b = 0; b < blocks; ++b) {
    if (b == start) x = {ops::add(x.hidden, residual.hidden, s), ops::add(x.encoder, residual.encoder, s)};
    if (b >= start && b < end) continue;
    x = model->block(b, x, p1.shared, {}, s);
  }
  expect_identical(out1, model->epilogue(x, p1, s), "replayed step");
  ASSERT_EQ(stages.step_counts().size(), 2u);
  EXPECT_EQ(stages.step_counts()[1].block_calls - stages.step_counts()[1].blocks_computed, end - start);
}

TEST(StepCaches, DbCacheDecisionRules) {
  CacheConfig c;
  c.method = CacheMethod::db;
  c.threshold = 0.1, c.warmup = 2, c.max_cached = 3, c.max_continuous = 2;
  using Counters = pipelines::DbCacheStage::Counters;
  const auto decide = [&](int step, double diff, Counters n, bool previous = true) {
    return pipelines::DbCacheStage::decide(c, step, diff, previous, n).cache;
  };
  EXPECT_FALSE(decide(1, 0.0, {}));          // warm-up
  EXPECT_TRUE(decide(2, 0.05, {}));          // below the threshold
  EXPECT_FALSE(decide(2, 0.1, {}));          // at the threshold: computed (diff < threshold caches)
  EXPECT_FALSE(decide(5, 0.01, {3, 0, 4}));  // max cached reached
  EXPECT_FALSE(decide(5, 0.01, {1, 2, 2}));  // max continuous reached
  EXPECT_TRUE(decide(5, 0.01, {1, 1, 4}));
  EXPECT_FALSE(decide(5, 0.01, {}, /*previous=*/false));
  c.threshold = 0;
  EXPECT_FALSE(decide(5, 0.0, {}));
}

// Drives a DbCacheStage with fake blocks: block b adds a constant c_b(step) to the state, so the
// first-block residual is known exactly and the decisions follow a constructed diff sequence.
TEST(StepCaches, DbCacheOnAConstructedSequence) {
  CacheConfig c;
  c.method = CacheMethod::db;
  c.fn = 1, c.bn = 1, c.threshold = 0.1, c.warmup = 1;
  pipelines::DbCacheStage stage(c);
  stage.begin_run({6, 4, {models::CfgBranch::cond}, false});
  const Stream s = ops::default_op_stream();
  // R_F at step t = first block's increment: 1.0, 1.05 (diff 0.05: cached), 1.5 (diff 0.5 vs the last
  // computed step's 1.0: computed), 1.52 (0.013: cached), 1.6 (0.053 vs 1.5: cached), 3.0 (computed).
  const std::vector<float> first = {1.0f, 1.05f, 1.5f, 1.52f, 1.6f, 3.0f};
  const std::vector<bool> cached = {false, true, false, true, true, false};
  for (int step = 0; step < 6; ++step) {
    const models::StepInfo info{step, 6, 0, 0, models::CfgBranch::cond};
    models::BlockState x{Tensor::from_vector(std::vector<float>(8, 0.0f), {1, 2, 4}), {}};
    int computed = 0;
    for (int b = 0; b < 4; ++b) {
      const float add = b == 0 ? first[static_cast<std::size_t>(step)] : static_cast<float>(10 * b + step);
      x = stage.run_block(
          info, {b, 4, "b" + std::to_string(b)}, x,
          [&](const models::BlockState& in) {
            ++computed;
            return models::BlockState{ops::add(in.hidden, Tensor::from_vector(std::vector<float>{add}, {1}), s), {}};
          },
          s);
    }
    EXPECT_EQ(computed, cached[static_cast<std::size_t>(step)] ? 2 : 4) << "step " << step;
    // Cached steps add the middle residual of the last computed step (10 + 20 + 2 x that step).
    const int last = cached[static_cast<std::size_t>(step)] ? (step <= 2 ? (step == 1 ? 0 : 2) : 2) : step;
    const float middle = static_cast<float>(10 * 1 + last + 10 * 2 + last);
    const float want = first[static_cast<std::size_t>(step)] + middle + static_cast<float>(30 + step);
    EXPECT_FLOAT_EQ(x.hidden.data<float>()[0], want) << "step " << step;
  }
  EXPECT_NE(stage.summary().find("3 cached step(s) [1,3,4]"), std::string::npos) << stage.summary();
}

TEST(TaylorSeer, ExtrapolatesWithDividedDifferences) {
  const Stream s = ops::default_op_stream();
  auto y_at = [](double a, double b, double c, int t) { return static_cast<float>(a + b * t + c * t * t); };
  // Order 1 on a line, computed at steps 0, 2, 4: exact at every later step.
  pipelines::TaylorSeer line(1);
  for (int t : {0, 2, 4}) line.update(Tensor::from_vector(std::vector<float>{y_at(1, 0.5, 0, t)}, {1}), t, s);
  for (int t : {5, 6, 9}) EXPECT_NEAR(line.approximate(t, DType::f32, s).data<float>()[0], y_at(1, 0.5, 0, t), 1e-5) << t;
  // Order 2 on a parabola, computed at 0, 2, 4, 6 (window 2): backward differences
  // d1 = (Y(6) - Y(4)) / 2, d2 = (d1(6) - d1(4)) / 2, extrapolated Y(6) + d1 e + d2 e^2 / 2.
  pipelines::TaylorSeer parabola(2);
  for (int t : {0, 2, 4, 6}) parabola.update(Tensor::from_vector(std::vector<float>{y_at(2, -1, 0.25, t)}, {1}), t, s);
  const double d1_6 = (y_at(2, -1, 0.25, 6) - y_at(2, -1, 0.25, 4)) / 2.0, d1_4 = (y_at(2, -1, 0.25, 4) - y_at(2, -1, 0.25, 2)) / 2.0;
  const double d2 = (d1_6 - d1_4) / 2.0;
  for (int e : {1, 2, 3}) {
    const double want = y_at(2, -1, 0.25, 6) + d1_6 * e + d2 * e * e / 2.0;
    EXPECT_NEAR(parabola.approximate(6 + e, DType::f32, s).data<float>()[0], want, 1e-4) << e;
  }
  // cache-dit's rule: no difference before step 2, so steps 0 and 1 alone extrapolate flat.
  pipelines::TaylorSeer early(1);
  early.update(Tensor::from_vector(std::vector<float>{1.0f}, {1}), 0, s);
  early.update(Tensor::from_vector(std::vector<float>{2.0f}, {1}), 1, s);
  EXPECT_EQ(early.approximate(3, DType::f32, s).data<float>()[0], 2.0f);
}

TEST(StepCaches, RelativeL1Diff) {
  const Tensor a = Tensor::from_vector(std::vector<float>{1, -2, 3, -4}, {4}),
               b = Tensor::from_vector(std::vector<float>{1, -1, 3, -5}, {4});
  EXPECT_DOUBLE_EQ(pipelines::relative_l1_diff(a, b), 2.0 / 10.0);
  EXPECT_TRUE(std::isinf(pipelines::relative_l1_diff(a, Tensor::zeros({5}, DType::f32))));
}

TEST(StepCacheConfig, LoadsAFileAndNamesItInErrors) {
  TempDir dir("cubevec_cache_config");
  const std::string good =
      dir.write("good.json", R"({"cache": "attention", "cache-step-start": 20, "cache-interval": 2, "cache-step-end": 47})");
  const CacheConfig c = CacheConfig::load(good);
  EXPECT_EQ(c.method, CacheMethod::attention);
  EXPECT_EQ(c.step_end, 47);
  const std::string bad = dir.write("bad.json", R"({"cache": "attention", "cache-interval": 0})");
  EXPECT_NE(message_of([&] { CacheConfig::load(bad); }).find(bad + ": 'cache-interval' must be an integer in [1,"), std::string::npos);
  const std::string broken = dir.write("broken.json", R"({"cache": )");
  EXPECT_NE(message_of([&] { CacheConfig::load(broken); }).find(broken), std::string::npos);
}

}  // namespace step_cache_test
}  // namespace cubevec
