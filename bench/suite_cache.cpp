// Suite `cache`: the step caches on the shipped tinyflux (28 steps, 64 x 64, its reference prompt)
// and on the tiny test Wan model (tests/data/wan_tiny, random weights, 50 steps, 9 frames of
// 64 x 64): for each setting, the denoising time (median over the repeats; the settings run in
// rounds, each round starting at another setting, so drift and position effects hit them alike), the speedup over no cache measured in the same run, the block and
// attention computations skipped, and the quality of the decoded picture / video against the
// uncached one (PSNR and max abs error in [0, 1] pixels). tools/plot_cache.py draws the
// speed/quality curve from the --json output.
#include <algorithm>
#include <cstdio>
#include <map>

#include "bench/harness.h"
#include "models/parameters.h"
#include "models/tiny_text_encoder.h"
#include "ops/vector_ops.h"
#include "pipelines/flux_t2i.h"
#include "pipelines/quality.h"
#include "pipelines/stages/cache_config.h"
#include "pipelines/wan_t2v.h"

namespace cubevec::bench {

namespace {

using pipelines::CacheConfig;
using pipelines::CacheMethod;

CacheConfig mindie(CacheMethod method, int start, int interval, int block_start = 0, std::optional<int> block_end = {},
                   std::optional<int> step_end = {}) {
  CacheConfig c;
  c.method = method;
  c.step_start = start, c.step_interval = interval, c.block_start = block_start, c.block_end = block_end, c.step_end = step_end;
  return c;
}

CacheConfig db(int fn, int bn, double threshold, int warmup, int taylorseer = 0, int max_continuous = -1) {
  CacheConfig c;
  c.method = CacheMethod::db;
  c.fn = fn, c.bn = bn, c.threshold = threshold, c.warmup = warmup, c.taylorseer = taylorseer, c.max_continuous = max_continuous;
  return c;
}

struct Outcome {
  std::vector<double> denoise_s;
  Tensor picture;
  double blocks_skipped = 0, attention_skipped = 0;  // fractions of the calls
};

// One generation: the final picture, the denoising seconds and the stages' counts.
using Generate = std::function<std::pair<Tensor, double>(pipelines::StageList&)>;

void run_settings(Context& context, const std::string& model, const std::vector<CacheConfig>& settings, int steps, int blocks,
                  const Generate& generate) {
  std::vector<Outcome> outcomes(settings.size() + 1);  // [0]: no cache
  const int repeats = std::max(3, context.repeats);
  for (int r = 0; r < repeats + 1; ++r)  // the first round warms up (tuners, allocator) and is not timed
    for (std::size_t k = 0; k < outcomes.size(); ++k) {
      const std::size_t i = (k + static_cast<std::size_t>(r)) % outcomes.size();  // each round starts elsewhere
      pipelines::StageList stages;
      if (i > 0) stages.add(pipelines::make_cache_stage(settings[i - 1], steps, blocks));
      const auto [picture, seconds] = generate(stages);
      if (r == 0) continue;
      Outcome& o = outcomes[i];
      o.denoise_s.push_back(seconds);
      o.picture = picture;
      double calls = 0, computed = 0, attention = 0, attention_computed = 0;
      for (const auto& c : stages.step_counts()) {
        calls += c.block_calls, computed += c.blocks_computed, attention += c.attention_calls, attention_computed += c.attention_computed;
      }
      o.blocks_skipped = calls > 0 ? 1 - computed / calls : 0;
      o.attention_skipped = attention > 0 ? 1 - attention_computed / attention : 0;
    }
  const Timing reference = summarize(outcomes[0].denoise_s);
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    Result row{"cache", model + " " + (i == 0 ? std::string("no cache") : settings[i - 1].describe()), "cubevec"};
    row.timing = summarize(outcomes[i].denoise_s);
    row.extra["speedup"] = reference.median_s / row.timing.median_s;
    row.extra["speedup_min"] = reference.min_s / row.timing.min_s;  // the ratio of the fastest runs, a check on noise
    row.extra["blocks_skipped"] = outcomes[i].blocks_skipped;
    row.extra["attention_skipped"] = outcomes[i].attention_skipped;
    if (i > 0) {
      const pipelines::Quality q = pipelines::compare_pictures(outcomes[i].picture, outcomes[0].picture);
      row.extra["psnr_db"] = std::isfinite(q.psnr_db) ? q.psnr_db : 999.0;
      row.extra["max_abs"] = q.max_abs;
    }
    context.add(row);
  }
}

void tinyflux(Context& context, Device& device) {
  const std::string dir = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";
  const pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(dir);
  const auto encoder = models::TinyTextEncoder::load(dir, device.default_stream());
  const models::PromptEmbeddings prompt = encoder->encode("a red circle on a blue background");
  const int steps = 28, blocks = pipeline.transformer().block_count();
  pipelines::T2IOptions o;
  o.width = o.height = pipeline.default_image_size();
  o.steps = steps;
  const std::vector<CacheConfig> settings = {
      mindie(CacheMethod::attention, 5, 2),
      mindie(CacheMethod::attention, 3, 3),
      mindie(CacheMethod::attention, 2, 4),
      mindie(CacheMethod::dit_block, 5, 2, 1, blocks),
      mindie(CacheMethod::dit_block, 4, 3, 1, blocks),
      mindie(CacheMethod::dit_block, 3, 4, 1, blocks),
      mindie(CacheMethod::dit_block, 2, 5, 1, blocks),
      mindie(CacheMethod::dit_block, 2, 6, 1, blocks),
      mindie(CacheMethod::dit_block, 2, 8, 1, blocks),
      mindie(CacheMethod::dit_block, 3, 3, 2, blocks),
      db(1, 0, 0.05, 4),
      db(1, 0, 0.1, 4),
      db(1, 0, 0.2, 4),
      db(1, 0, 0.3, 3),
      db(1, 0, 0.2, 4, 1),
      db(1, 0, 0.3, 3, 2),
  };
  run_settings(context, "tinyflux", settings, steps, blocks, [&](pipelines::StageList& stages) {
    pipelines::T2ITimings timings;
    const Tensor latents = pipeline.denoise(prompt, nullptr, o, device, {}, timings, &stages);
    return std::make_pair(pipeline.decode(latents, o, device, timings), timings.denoise_s);
  });
}

void tinywan(Context& context, Device& device) {
  const std::string dir = std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/wan_tiny";
  const pipelines::WanT2VPipeline pipeline = pipelines::WanT2VPipeline::load(dir);
  const int steps = 50, blocks = pipeline.transformer().block_count();
  pipelines::T2VOptions o;
  o.width = o.height = 64, o.frames = 9, o.steps = steps, o.cfg = pipelines::CfgMode::off;
  models::ParameterTable inputs;
  Tensor text;
  inputs.add("prompt_embeds", {1, 7, pipeline.transformer().config().text_dim}, &text);
  models::make_random_parameters(inputs, DType::f32, 3, 1.0f);
  const models::PromptEmbeddings prompt{text, {}};
  const std::vector<CacheConfig> settings = {
      mindie(CacheMethod::attention, 20, 2, 0, {}, 47),
      mindie(CacheMethod::attention, 10, 3),
      mindie(CacheMethod::dit_block, 10, 2, 1, blocks),
      mindie(CacheMethod::dit_block, 10, 3, 1, blocks),
      db(1, 0, 0.1, 8),
      db(1, 0, 0.2, 8, 2),
  };
  run_settings(context, "tiny wan", settings, steps, blocks, [&](pipelines::StageList& stages) {
    pipelines::T2ITimings timings;
    const Tensor latents = pipeline.denoise(prompt, nullptr, o, device, {}, timings, &stages);
    std::vector<Tensor> chunks;
    pipeline.decode(
        latents, o, device, [&](const Tensor& frames) { chunks.push_back(frames); }, timings);
    return std::make_pair(ops::concat(chunks, 2, device.default_stream()), timings.denoise_s);
  });
}

}  // namespace

void cache_suite(Context& context) {
  DeviceProfile profile = builtin_cpu_profile();
  profile.cube_threads = context.machine.threads;
  profile.vector_threads = context.machine.threads;
  Device device(profile);
  tinyflux(context, device);
  tinywan(context, device);
}

}  // namespace cubevec::bench
