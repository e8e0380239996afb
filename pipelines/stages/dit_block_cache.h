// MindIE SD's DiTBlockCache as a stage (docs/stages.md, "MindIE SD's CacheConfig"; read against
// mindiesd/cache_agent/dit_block_cache.py). Steps s >= step_start with (s - step_start) %
// step_interval == 0 compute every block and keep, for the span [block_start, block_end), the state
// entering block_start and the residual (output of block_end - 1 minus that input, for the image
// and the text stream). The other steps from step_start on replay the span: block_start returns its
// input plus the residual, the later blocks of the span return their input. step_end is not
// consulted (as in MindIE). One cache per CFG branch.
// One deliberate difference: a span of one block (block_end = block_start + 1) keeps its residual;
// MindIE's update stores only the input there, so its replay would add the input to itself.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "pipelines/stages/cache_config.h"

namespace cubevec::pipelines {

class DiTBlockCacheStage : public Stage {
 public:
  DiTBlockCacheStage(CacheConfig config, int steps, int blocks);
  std::string name() const override { return "cache dit-block"; }
  void begin_run(const RunInfo& run) override;
  void restart(const RunInfo& run) override;  // the old model's state dropped, the counts kept
  bool uses_blocks() const override { return !bypass_; }
  models::BlockState run_block(const models::StepInfo& step, const models::BlockIdentity& id, const models::BlockState& in,
                               const models::BlockCompute& compute, const Stream& stream) override;
  std::string summary() const override;
  nlohmann::ordered_json report() const override;

  bool compute_step(int step) const;        // every block computed, the span's residual kept
  bool replays(int step, int block) const;  // the block is replayed from the residual

 private:
  struct Kept {
    models::BlockState input, residual;
  };
  CacheConfig config_;
  int block_end_;
  std::optional<std::string> bypass_;
  std::map<models::CfgBranch, Kept> kept_;
  int replayed_spans_ = 0;
};

}  // namespace cubevec::pipelines
