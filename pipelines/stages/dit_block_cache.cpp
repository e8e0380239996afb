#include "pipelines/stages/dit_block_cache.h"

#include "pipelines/stages/residual_math.h"

namespace cubevec::pipelines {

DiTBlockCacheStage::DiTBlockCacheStage(CacheConfig config, int steps, int blocks)
    : config_(std::move(config)), block_end_(config_.block_end.value_or(blocks)), bypass_(config_.bypass_reason(steps, blocks)) {}

void DiTBlockCacheStage::begin_run(const RunInfo&) {
  kept_.clear();
  replayed_spans_ = 0;
}

void DiTBlockCacheStage::restart(const RunInfo&) { kept_.clear(); }

bool DiTBlockCacheStage::compute_step(int s) const {
  return s >= config_.step_start && (s - config_.step_start) % config_.step_interval == 0;
}

bool DiTBlockCacheStage::replays(int s, int b) const {
  return s >= config_.step_start && !compute_step(s) && config_.block_start <= b && b < block_end_;
}

models::BlockState DiTBlockCacheStage::run_block(const models::StepInfo& step, const models::BlockIdentity& id,
                                                 const models::BlockState& in, const models::BlockCompute& compute, const Stream& s) {
  Kept& kept = kept_[step.branch];
  if (replays(step.index, id.index) && kept.residual.hidden.defined()) {
    if (id.index != config_.block_start) return in;  // inside the span: adds 0
    ++replayed_spans_;
    return {ops::add(in.hidden, kept.residual.hidden, s), add_if(in.encoder, kept.residual.encoder, s)};
  }
  const models::BlockState out = compute(in);
  if (compute_step(step.index)) {
    if (id.index == config_.block_start) kept.input = in;
    if (id.index == block_end_ - 1)
      kept.residual = {ops::sub(out.hidden, kept.input.hidden, s), sub_if(out.encoder, kept.input.encoder, s)};
  }
  return out;
}

std::string DiTBlockCacheStage::summary() const {
  if (bypass_) return "bypassed: " + *bypass_;
  return "blocks [" + std::to_string(config_.block_start) + ", " + std::to_string(block_end_) + ") from step " +
         std::to_string(config_.step_start) + ", computed every " + std::to_string(config_.step_interval) + ": " +
         std::to_string(replayed_spans_) + " spans replayed";
}

nlohmann::ordered_json DiTBlockCacheStage::report() const {
  nlohmann::ordered_json j = config_.to_json();
  j["bypassed"] = bypass_ ? nlohmann::ordered_json(*bypass_) : nlohmann::ordered_json(nullptr);
  j["spans_replayed"] = replayed_spans_;
  return j;
}

}  // namespace cubevec::pipelines
