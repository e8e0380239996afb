#include "pipelines/stages/attention_cache.h"

namespace cubevec::pipelines {

AttentionCacheStage::AttentionCacheStage(CacheConfig config, int steps, int blocks)
    : config_(std::move(config)), step_end_(config_.step_end.value_or(steps)), bypass_(config_.bypass_reason(steps, blocks)) {}

void AttentionCacheStage::begin_run(const RunInfo&) {
  kept_.clear();
  replayed_ = 0;
}

void AttentionCacheStage::restart(const RunInfo&) { kept_.clear(); }

bool AttentionCacheStage::reuses(int s) const {
  return config_.step_start < s && s <= step_end_ && (s - config_.step_start) % config_.step_interval != 0;
}

bool AttentionCacheStage::stores(int s) const { return config_.step_start <= s && s < step_end_; }

Tensor AttentionCacheStage::attend(const models::StepInfo& step, const models::AttentionIdentity& id,
                                   const models::AttentionProjection& project, const Stream& /*stream*/, const AttendNext& next) {
  if (id.kind == models::AttentionKind::cross) return next(project);
  Tensor& slot = kept_[{step.branch, id.module}];
  if (reuses(step.index) && slot.defined()) {
    ++replayed_;
    return slot;
  }
  Tensor out = next(project);
  if (stores(step.index)) slot = out;
  return out;
}

std::string AttentionCacheStage::summary() const {
  if (bypass_) return "bypassed: " + *bypass_;
  return "steps " + std::to_string(config_.step_start) + ".." + std::to_string(step_end_) + " every " +
         std::to_string(config_.step_interval) + ": " + std::to_string(replayed_) + " attention outputs replayed";
}

nlohmann::ordered_json AttentionCacheStage::report() const {
  nlohmann::ordered_json j = config_.to_json();
  j["bypassed"] = bypass_ ? nlohmann::ordered_json(*bypass_) : nlohmann::ordered_json(nullptr);
  j["attention_replayed"] = replayed_;
  return j;
}

}  // namespace cubevec::pipelines
