#include "pipelines/stages/db_cache.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "ops/vector_ops.h"
#include "pipelines/stages/residual_math.h"
#include "pipelines/tensor_values.h"
#include "tensor/half.h"

namespace cubevec::pipelines {

double relative_l1_diff(const Tensor& previous, const Tensor& current) {
  if (previous.shape() != current.shape()) return std::numeric_limits<double>::infinity();  // not similar
  const std::vector<double> a = host_values(previous), b = host_values(current);
  double diff = 0, base = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += std::abs(a[i] - b[i]);
    base += std::abs(a[i]);
  }
  return base > 0 ? diff / base : std::numeric_limits<double>::infinity();
}

DbCacheStage::DbCacheStage(CacheConfig config) : config_(std::move(config)) {}

std::string DbCacheStage::name() const {
  return "cache db F" + std::to_string(config_.fn) + "B" + std::to_string(config_.bn) +
         (config_.taylorseer ? " TaylorSeer " + std::to_string(config_.taylorseer) : "");
}

void DbCacheStage::begin_run(const RunInfo& run) {
  simulate_ = run.simulate;
  branches_.clear();
  diffs_.clear();
  cached_steps_.clear();
}

void DbCacheStage::restart(const RunInfo&) { branches_.clear(); }

DbCacheStage::Decision DbCacheStage::decide(const CacheConfig& c, int step, double diff, bool have_previous, const Counters& n) {
  if (step < c.warmup) return {false, "warm-up"};
  if (c.max_cached >= 0 && n.cached_steps >= c.max_cached) return {false, "max cached steps"};
  if (c.max_continuous >= 0 && n.continuous >= c.max_continuous) return {false, "max continuous cached steps"};
  if (c.threshold <= 0) return {false, "threshold 0"};
  if (!have_previous) return {false, "no computed step to compare with"};
  if (std::isnan(diff)) return {true, "fixed schedule"};  // simulate: the caller already alternated
  if (diff < c.threshold) return {true, "diff below threshold"};
  return {false, "diff at or above threshold"};
}

void DbCacheStage::decide_step(Branch& b, const models::StepInfo& step, const Tensor& fn_output, const Stream& s) {
  const bool have_previous = b.fn_residual_prev.defined() && b.mid_residual.hidden.defined();
  double diff = std::numeric_limits<double>::quiet_NaN();
  Tensor fn_residual;
  if (simulate_) {
    // No data: alternate after the warm-up (a step right after a computed one may be cached).
    if (b.counters.last_computed_step != step.index - 1) {
      b.caching = false;
    } else {
      b.caching = decide(config_, step.index, diff, have_previous, b.counters).cache;
    }
  } else {
    fn_residual = ops::sub(fn_output, b.input0, s);
    if (have_previous && step.index >= config_.warmup) diff = relative_l1_diff(b.fn_residual_prev, fn_residual);
    b.caching = decide(config_, step.index, diff, have_previous, b.counters).cache;
  }
  diffs_.push_back(diff);
  if (b.caching) {
    ++b.counters.cached_steps;
    ++b.counters.continuous;
    cached_steps_.push_back(step.index);
  } else {
    b.counters.continuous = 0;
    b.counters.last_computed_step = step.index;
    b.fn_residual_prev = simulate_ ? fn_output : fn_residual;  // refreshed on computed steps only
  }
}

models::BlockState DbCacheStage::replayed(Branch& b, const models::StepInfo& step, const models::BlockState& in, const Stream& s) {
  if (b.seer_hidden && b.seer_hidden->ready()) {
    const Tensor h = b.seer_hidden->approximate(step.index, in.hidden.dtype(), s);
    const Tensor e = b.seer_encoder && b.seer_encoder->ready() ? b.seer_encoder->approximate(step.index, in.encoder.dtype(), s) : Tensor();
    return {ops::add(in.hidden, h, s), add_if(in.encoder, e, s)};
  }
  return {ops::add(in.hidden, b.mid_residual.hidden, s), add_if(in.encoder, b.mid_residual.encoder, s)};
}

models::BlockState DbCacheStage::run_block(const models::StepInfo& step, const models::BlockIdentity& id, const models::BlockState& in,
                                           const models::BlockCompute& compute, const Stream& s) {
  Branch& b = branches_[step.branch];
  const int fn = config_.fn, mid_end = id.count - config_.bn;
  if (id.index == 0) {
    b.input0 = in.hidden;
    b.caching = false;
  }
  if (id.index < fn) {
    models::BlockState out = compute(in);
    if (id.index == fn - 1) decide_step(b, step, out.hidden, s);
    return out;
  }
  if (id.index >= mid_end) return compute(in);
  // The middle blocks.
  if (b.caching) return id.index == fn ? replayed(b, step, in, s) : in;
  if (id.index == fn) b.mid_input = in;
  models::BlockState out = compute(in);
  if (id.index == mid_end - 1) {
    b.mid_residual = {ops::sub(out.hidden, b.mid_input.hidden, s), sub_if(out.encoder, b.mid_input.encoder, s)};
    if (config_.taylorseer > 0) {
      if (!b.seer_hidden) b.seer_hidden = std::make_unique<TaylorSeer>(config_.taylorseer);
      b.seer_hidden->update(b.mid_residual.hidden, step.index, s);
      if (b.mid_residual.encoder.defined()) {
        if (!b.seer_encoder) b.seer_encoder = std::make_unique<TaylorSeer>(config_.taylorseer);
        b.seer_encoder->update(b.mid_residual.encoder, step.index, s);
      }
    }
  }
  return out;
}

std::string DbCacheStage::summary() const {
  std::string steps;
  for (int s : cached_steps_) steps += (steps.empty() ? "" : ",") + std::to_string(s);
  char text[160];
  std::snprintf(text, sizeof text, "threshold %g, warm-up %d: %zu cached step(s)%s", config_.threshold, config_.warmup,
                cached_steps_.size(), simulate_ ? " (simulate: a fixed alternating schedule after the warm-up, no data to compare)" : "");
  return std::string(text) + (steps.empty() ? "" : " [" + steps + "]");
}

nlohmann::ordered_json DbCacheStage::report() const {
  nlohmann::ordered_json j = config_.to_json();
  j["simulated_schedule"] = simulate_;
  j["cached_steps"] = cached_steps_;
  nlohmann::ordered_json diffs = nlohmann::ordered_json::array();
  for (double d : diffs_) diffs.push_back(std::isfinite(d) ? nlohmann::ordered_json(d) : nlohmann::ordered_json(nullptr));
  j["residual_diffs"] = diffs;
  return j;
}

}  // namespace cubevec::pipelines
