// cache-dit's DBCache (dual block cache; FBCache is its F1B0 case) as a stage (docs/stages.md,
// "cache-dit's DBCache and TaylorSeer"; read against
// cache_dit/caching/cache_contexts/cache_manager.py). Per step and CFG branch: the first Fn blocks
// are computed and their residual R_F (hidden after block Fn-1 minus hidden entering block 0) is
// compared with the one of the last fully computed step,
// diff = mean|R_F_prev - R_F| / mean|R_F_prev|. When diff < threshold (and the step is past the
// warm-up, within --cache-max-cached and --cache-max-continuous), the middle blocks [Fn, N - Bn) are
// skipped: their residual R_M, kept from the last computed step (or extrapolated by TaylorSeer), is
// added to the state entering block Fn, for the image and the text stream. The last Bn blocks are
// always computed. R_F_prev is refreshed only on computed steps.
// Shape-only (simulate) runs cannot measure a diff: after the warm-up they alternate cached and
// computed steps (within the limits), which the summary states.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pipelines/stages/cache_config.h"
#include "pipelines/stages/taylorseer.h"

namespace cubevec::pipelines {

class DbCacheStage : public Stage {
 public:
  explicit DbCacheStage(CacheConfig config);
  std::string name() const override;  // "cache db F8B0" (+ " TaylorSeer 2")
  void begin_run(const RunInfo& run) override;
  void restart(const RunInfo& run) override;  // the old model's state dropped, the counts kept
  bool uses_blocks() const override { return true; }
  models::BlockState run_block(const models::StepInfo& step, const models::BlockIdentity& id, const models::BlockState& in,
                               const models::BlockCompute& compute, const Stream& stream) override;
  std::string summary() const override;
  nlohmann::ordered_json report() const override;

  // The decision at the end of block Fn-1, from the diff (NaN: none measurable) and the limits:
  // exposed so tests can drive it with constructed sequences.
  struct Decision {
    bool cache = false;
    std::string why;  // "warm-up", "threshold", "max cached", ...
  };
  struct Counters {
    int cached_steps = 0, continuous = 0, last_computed_step = -1;
  };
  static Decision decide(const CacheConfig& config, int step, double diff, bool have_previous, const Counters& counters);

 private:
  struct Branch {
    Tensor input0;            // hidden entering block 0 this step
    Tensor fn_residual_prev;  // R_F of the last computed step
    models::BlockState mid_input, mid_residual;
    bool caching = false;
    Counters counters;
    std::unique_ptr<TaylorSeer> seer_hidden, seer_encoder;
  };
  void decide_step(Branch& branch, const models::StepInfo& step, const Tensor& fn_output, const Stream& stream);
  models::BlockState replayed(Branch& branch, const models::StepInfo& step, const models::BlockState& in, const Stream& stream);

  CacheConfig config_;
  bool simulate_ = false;
  std::map<models::CfgBranch, Branch> branches_;
  std::vector<double> diffs_;      // per decision (NaN where none was measured)
  std::vector<int> cached_steps_;  // step indices cached (per branch decision)
};

// mean |a - b| / mean |a| over all elements (f32 or bf16, read on the host).
double relative_l1_diff(const Tensor& previous, const Tensor& current);

}  // namespace cubevec::pipelines
