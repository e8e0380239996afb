// MindIE SD's AttentionCache as a stage (docs/stages.md, "MindIE SD's CacheConfig"; read against
// mindiesd/cache_agent/attention_cache.py): the output of every self / joint attention module is
// kept, and at step s with step_start < s <= step_end and (s - step_start) % step_interval != 0 the
// kept output is returned instead of computing (projections and kernel both skipped). Outputs are
// stored when step_start <= s < step_end. The block range only enters MindIE's bypass rule; cross-
// attention (cheap, and not what MindIE's examples wrap) is always computed. One cache per CFG
// branch, as MindIE SD's examples keep one agent per branch.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "pipelines/stages/cache_config.h"

namespace cubevec::pipelines {

class AttentionCacheStage : public Stage {
 public:
  AttentionCacheStage(CacheConfig config, int steps, int blocks);
  std::string name() const override { return "cache attention"; }
  void begin_run(const RunInfo& run) override;
  void restart(const RunInfo& run) override;  // the old model's state dropped, the counts kept
  bool uses_attention() const override { return !bypass_; }
  Tensor attend(const models::StepInfo& step, const models::AttentionIdentity& id, const models::AttentionProjection& project,
                const Stream& stream, const AttendNext& next) override;
  std::string summary() const override;
  nlohmann::ordered_json report() const override;

  // MindIE's rule for step s: replay the kept output / keep the computed one.
  bool reuses(int step) const;
  bool stores(int step) const;

 private:
  CacheConfig config_;
  int step_end_;
  std::optional<std::string> bypass_;
  std::map<std::pair<models::CfgBranch, std::string>, Tensor> kept_;
  int replayed_ = 0;
};

}  // namespace cubevec::pipelines
