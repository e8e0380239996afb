// MindIE SD's sparse attention as a stage (ops/sparse_attention.h): from step `step_start` on, the
// self / joint attention of the chosen blocks runs block-sparse (rf_v2 or ada_bsa), dense before;
// cross-attention stays dense. The block mask of each attention module (and CFG branch) is
// estimated on refresh steps, every `mask_refresh` steps from step_start, and reused between them
// (RainFusion v3's mask reuse); rf_v2 still reorders q, k, v each step. The report gives the kept
// fraction of the blocks per step (the estimates' own counts; in simulate mode the fraction the
// cost model assumes from the shapes).
//   --sparse rf_v2 --sparsity 0.5 [--sparse-step-start N] [--sparse-blocks A-B] [--sparse-mask-refresh K]
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ops/sparse_attention.h"
#include "pipelines/stage.h"

namespace cubevec::pipelines {

struct SparseConfig {
  ops::SparseType type = ops::SparseType::none;
  double sparsity = 0.5;
  int step_start = 0;                         // steps before it run dense
  int block_first = 0;                        // blocks [block_first, block_last] (flat index) run sparse
  int block_last = -1;                        // -1: the last block
  int mask_refresh = 1;                       // re-estimate the masks every this many steps from step_start
  double cdf_threshold = 1.0;                 // ada_bsa
  bool keep_sink = true, keep_recent = true;  // ada_bsa

  // Throws naming the setting for values out of range (blocks checked against the model in begin_run).
  void validate() const;
  // "2-37" -> blocks 2 to 37 inclusive; throws naming the flag.
  static std::pair<int, int> parse_blocks(const std::string& text);
};

class SparseAttentionStage : public Stage {
 public:
  explicit SparseAttentionStage(SparseConfig config);
  std::string name() const override;  // "sparse rf_v2 0.5"
  // Throws naming --sparse-blocks unless its blocks lie in a model of `blocks` blocks.
  void check_blocks(int blocks) const;
  // Throws naming --sparse-step-start when no step of a `steps`-step run would be sparse.
  void check_steps(int steps) const;
  const SparseConfig& config() const { return config_; }
  void begin_run(const RunInfo& run) override;
  void restart(const RunInfo& run) override;  // the old model's state dropped, the counts kept
  void before_step(const models::StepInfo& step) override;
  bool uses_attention() const override { return true; }
  Tensor attend(const models::StepInfo& step, const models::AttentionIdentity& id, const models::AttentionProjection& project,
                const Stream& stream, const AttendNext& next) override;
  std::string summary() const override;
  nlohmann::ordered_json report() const override;

  // Whether step s estimates new masks (it does on step_start and every mask_refresh steps after).
  bool refreshes(int step) const;
  // Per step: the kept fraction of the sparse modules' blocks (-1 for a step that ran dense);
  // read after the run (the estimates finish with it).
  std::vector<double> kept_fraction_per_step() const;
  int estimates() const { return estimates_; }
  const std::vector<int>& estimates_per_step() const { return estimates_per_step_; }

 private:
  struct Use {
    std::shared_ptr<ops::SparseMaskStats> stats;
    double expected = 1.0;
  };
  SparseConfig config_;
  RunInfo run_;
  int block_last_ = 0;
  std::map<std::pair<models::CfgBranch, std::string>, ops::SparseMask> masks_;  // by branch and module
  std::vector<std::vector<Use>> uses_;                                          // per step: the masks its sparse calls used
  std::vector<int> estimates_per_step_;
  int estimates_ = 0, sparse_calls_ = 0;
  std::string note_;
};

}  // namespace cubevec::pipelines
