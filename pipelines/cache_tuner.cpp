#include "pipelines/cache_tuner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "ops/vector_ops.h"
#include "pipelines/stages/attention_cache.h"
#include "pipelines/stages/dit_block_cache.h"
#include "pipelines/tensor_values.h"
#include "base/error.h"
#include "tensor/half.h"

namespace cubevec::pipelines {

namespace {

// Records the hidden state entering every block (and leaving the last) at every step, for the
// dit-block proxy. Only the first forward of a step (one branch) is kept.
class StateRecorder : public Stage {
 public:
  std::string name() const override { return "tuner recorder"; }
  bool uses_blocks() const override { return true; }
  void before_step(const models::StepInfo&) override { states.emplace_back(); }
  models::BlockState run_block(const models::StepInfo& step, const models::BlockIdentity& id, const models::BlockState& in,
                               const models::BlockCompute& compute, const Stream&) override {
    std::vector<std::vector<double>>& step_states = states.back();
    const bool first_forward = static_cast<int>(step_states.size()) == id.index;
    if (first_forward) step_states.push_back(host_values(in.hidden));
    models::BlockState out = compute(in);
    if (first_forward && id.index == id.count - 1) step_states.push_back(host_values(out.hidden));
    (void)step;
    return out;
  }
  std::vector<std::vector<std::vector<double>>> states;  // [step][boundary 0..N][element]
};

// MindIE's replay error proxy for the span [start, end): the span's residual at each replayed step
// against the one of its last computed step, mean squared.
double span_proxy(const StateRecorder& rec, const DiTBlockCacheStage& schedule, int steps, int start, int end) {
  double total = 0;
  int last_computed = -1;
  for (int s = 0; s < steps; ++s) {
    if (!schedule.replays(s, start)) {
      last_computed = s;
      continue;
    }
    if (last_computed < 0) continue;
    const auto& a_in = rec.states[static_cast<std::size_t>(s)][static_cast<std::size_t>(start)];
    const auto& a_out = rec.states[static_cast<std::size_t>(s)][static_cast<std::size_t>(end)];
    const auto& b_in = rec.states[static_cast<std::size_t>(last_computed)][static_cast<std::size_t>(start)];
    const auto& b_out = rec.states[static_cast<std::size_t>(last_computed)][static_cast<std::size_t>(end)];
    double sum = 0;
    for (std::size_t i = 0; i < a_in.size(); ++i) {
      const double d = (a_out[i] - a_in[i]) - (b_out[i] - b_in[i]);
      sum += d * d;
    }
    total += sum / static_cast<double>(std::max<std::size_t>(1, a_in.size()));
  }
  return total;
}

CacheTrial run_trial(const CacheTuneRun& run, const CacheConfig& config, int steps, int blocks, const Tensor& reference, double reference_s,
                     double target) {
  StageList stages;
  stages.add(make_cache_stage(config, steps, blocks));
  const auto [out, seconds] = run(stages);
  CacheTrial t;
  t.config = config;
  t.seconds = seconds;
  t.speedup = reference_s / seconds;
  t.mse = mean_squared_error(out, reference);
  t.reaches_target = t.speedup >= target;
  return t;
}

int replayed_steps(const DiTBlockCacheStage& schedule, int steps, int start) {
  int n = 0;
  for (int s = 0; s < steps; ++s) n += schedule.replays(s, start) ? 1 : 0;
  return n;
}

}  // namespace

double mean_squared_error(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape())
    throw Error("mean_squared_error: shapes " + shape_to_string(a.shape()) + " and " + shape_to_string(b.shape()) + " differ");
  const std::vector<double> x = host_values(a), y = host_values(b);
  double sum = 0;
  for (std::size_t i = 0; i < x.size(); ++i) sum += (x[i] - y[i]) * (x[i] - y[i]);
  return x.empty() ? 0.0 : sum / static_cast<double>(x.size());
}

CacheTuneResult tune_cache(const CacheTuneRun& run, int steps, int blocks, const CacheTuneOptions& o, const CacheTuneProgress& progress) {
  if (!(o.target_speedup > 1.0) || !std::isfinite(o.target_speedup))
    throw Error("--target-speedup must be a finite number above 1, got " + std::to_string(o.target_speedup));
  if (o.max_trials < 1) throw Error("--max-trials must be at least 1, got " + std::to_string(o.max_trials));
  const auto say = [&](const std::string& text) {
    if (progress) progress(text);
  };
  CacheTuneResult result;
  // The reference: uncached, recording the block states for the dit-block proxy; its time is the
  // faster of this run and a plain one (the recorder copies states to the host).
  say("reference run (no cache)");
  StageList recorded;
  auto recorder_owner = std::make_unique<StateRecorder>();
  StateRecorder& recorder = *recorder_owner;
  recorded.add(std::move(recorder_owner));
  const Tensor reference = run(recorded).first;
  StageList none;
  const auto plain = run(none);
  result.reference_seconds = plain.second;

  for (CacheMethod method : o.methods) {
    if (method == CacheMethod::dit_block) {
      CacheConfig base;
      base.method = CacheMethod::dit_block;
      base.step_start = o.step_start.value_or(steps / 5);
      base.step_interval = o.interval.value_or(2);
      const DiTBlockCacheStage schedule(base, steps, blocks);
      const int replays = replayed_steps(schedule, steps, 1);
      // Skipping k blocks on `replays` steps removes k * replays of steps * blocks block computations.
      const double needed = static_cast<double>(steps) * blocks * (1.0 - 1.0 / o.target_speedup);
      const int min_span = replays > 0 ? static_cast<int>(std::ceil(needed / replays)) : blocks;
      if (min_span > blocks - 1) {
        result.notes.push_back("dit-block: replaying " + std::to_string(replays) + " of " + std::to_string(steps) + " steps (step start " +
                               std::to_string(base.step_start) + ", interval " + std::to_string(base.step_interval) + ") cannot skip the " +
                               std::to_string(static_cast<long long>(std::ceil(needed))) +
                               " block computations the target needs with block 0 computed");
        continue;
      }
      std::vector<CacheTrial> ranked;
      for (int length = min_span; length <= std::min(blocks - 1, min_span + 1); ++length)
        for (int start = 1; start + length <= blocks; ++start) {
          CacheTrial t;
          t.config = base;
          t.config.block_start = start;
          t.config.block_end = start + length;
          t.proxy = span_proxy(recorder, schedule, steps, start, start + length);
          ranked.push_back(t);
        }
      std::sort(ranked.begin(), ranked.end(), [](const CacheTrial& a, const CacheTrial& b) { return a.proxy < b.proxy; });
      const std::size_t keep = std::min<std::size_t>({ranked.size(), 3, static_cast<std::size_t>(o.max_trials)});
      for (std::size_t i = 0; i < keep; ++i) {
        say("dit-block blocks [" + std::to_string(ranked[i].config.block_start) + ", " + std::to_string(*ranked[i].config.block_end) + ")");
        CacheTrial t = run_trial(run, ranked[i].config, steps, blocks, reference, result.reference_seconds, o.target_speedup);
        t.proxy = ranked[i].proxy;
        result.trials.push_back(t);
      }
    } else if (method == CacheMethod::attention) {
      // The attention modules' share of the time: every attention after step 0 replayed.
      CacheConfig all;
      all.method = CacheMethod::attention;
      all.step_start = 0, all.step_interval = steps + 1, all.step_end = steps;
      say("attention share (every attention after step 0 replayed)");
      StageList probe;
      probe.add(make_cache_stage(all, steps, blocks));
      const double probe_s = run(probe).second;
      const double share =
          std::clamp((result.reference_seconds - probe_s) / result.reference_seconds * steps / std::max(1, steps - 1), 0.0, 1.0);
      const double needed_fraction = (1.0 - 1.0 / o.target_speedup) / std::max(share, 1e-9);
      if (needed_fraction > static_cast<double>(steps - 1) / steps) {
        char text[200];
        std::snprintf(text, sizeof text,
                      "attention: the attention modules take %.0f%% of a step here, so replaying them cannot reach %.2fx", 100.0 * share,
                      o.target_speedup);
        result.notes.push_back(text);
        continue;
      }
      const int needed_steps = static_cast<int>(std::ceil(needed_fraction * steps));
      // Candidates: the least caching (fewest replayed steps at or above the need), later starts first.
      std::vector<std::pair<int, CacheConfig>> candidates;
      for (int interval = 2; interval <= 5; ++interval)
        for (int start = 0; start < steps; ++start) {
          CacheConfig c;
          c.method = CacheMethod::attention;
          c.step_start = start, c.step_interval = interval;
          for (int end = start + 1; end <= steps; ++end) {
            c.step_end = end;
            const AttentionCacheStage s(c, steps, blocks);
            int reused = 0;
            for (int k = 0; k < steps; ++k) reused += s.reuses(k) ? 1 : 0;
            if (reused >= needed_steps) {
              candidates.push_back({reused * 1000 - start, c});
              break;
            }
          }
        }
      std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      const std::size_t keep = std::min<std::size_t>(candidates.size(), static_cast<std::size_t>(o.max_trials));
      for (std::size_t i = 0; i < keep; ++i) {
        const CacheConfig& c = candidates[i].second;
        say("attention steps " + std::to_string(c.step_start) + ".." + std::to_string(*c.step_end) + " every " +
            std::to_string(c.step_interval));
        result.trials.push_back(run_trial(run, c, steps, blocks, reference, result.reference_seconds, o.target_speedup));
      }
    }
  }
  for (const CacheTrial& t : result.trials)
    if (t.reaches_target && (!result.chosen || t.mse < result.chosen->mse)) result.chosen = t;
  return result;
}

}  // namespace cubevec::pipelines
