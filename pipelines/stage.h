// Acceleration stages: quantization, a timestep policy, sparse attention, step caches, ... Each is
// a Stage that a pipeline switches on or off; a stage acts only through the plug points of
// models/forward_context.h and the layer registry, so adding one never edits a model. The
// StageList chains the active stages into the one attention policy and block hook a forward sees,
// counts what was computed and what was skipped per step, and times each stage's own work.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/forward_context.h"
#include "models/parameters.h"

namespace cubevec::pipelines {

// What a stage learns of the run before the first step.
struct RunInfo {
  int steps = 0;
  int blocks = 0;                           // transformer blocks per forward
  std::vector<models::CfgBranch> branches;  // the branches the guidance's forwards carry
  bool simulate = false;                    // shape-only run: nothing can be decided from data
};

using AttendNext = std::function<Tensor(const models::AttentionProjection&)>;

class Stage {
 public:
  virtual ~Stage() = default;
  virtual std::string name() const = 0;  // the row of the stage table: "cache dit-block", ...

  // After the model is loaded: the layer registry, to swap Linears (quantization).
  virtual void after_load(models::ParameterTable& /*parameters*/) {}
  // A second model's weights (Wan2.2 A14B's transformer_2, BlockIdentity::model 1). A stage that
  // changes weights must handle it or refuse: this default refuses, naming the stage.
  virtual void after_load_second_model(models::ParameterTable& parameters);
  virtual void begin_run(const RunInfo& /*run*/) {}
  // Mid-run, a new model takes over (two experts): drop what the stage holds of the old one
  // (cached residuals, attention outputs, sparse masks) but keep the run's counts for the report.
  // By default: begin_run.
  virtual void restart(const RunInfo& run) { begin_run(run); }
  virtual void before_step(const models::StepInfo& /*step*/) {}

  // Attention plug point. `next` runs the stages below and finally dense attention; a stage may
  // call it (with `project` or its own), or return another output without calling it.
  virtual bool uses_attention() const { return false; }
  // Whether the stage computes the attention itself without calling `next` (ring attention), so no
  // attention stage may come after it.
  virtual bool computes_attention() const { return false; }
  virtual Tensor attend(const models::StepInfo& /*step*/, const models::AttentionIdentity& /*id*/,
                        const models::AttentionProjection& project, const Stream& /*stream*/, const AttendNext& next) {
    return next(project);
  }

  // Block plug point: `compute` runs the stages below and finally the block.
  virtual bool uses_blocks() const { return false; }
  virtual models::BlockState run_block(const models::StepInfo& /*step*/, const models::BlockIdentity& /*id*/, const models::BlockState& in,
                                       const models::BlockCompute& compute, const Stream& /*stream*/) {
    return compute(in);
  }

  // Sequence-split plug point: a stage that shards the tokens across ranks (Ulysses) returns itself.
  virtual models::SequenceSplit* sequence_split() { return nullptr; }
  // Tensor-split plug point: a stage that shards the channels across ranks (tensor parallel) returns itself.
  virtual models::TensorSplit* tensor_split() { return nullptr; }

  // Whether the stage keeps only some blocks' weights in memory at a time (offload): the loop then
  // computes nothing ahead for all steps, which would need every block's weights at once.
  virtual bool streams_weights() const { return false; }

  // One line for the stage table ("skipped 40 of 112 ...", a schedule note), and the JSON figures.
  virtual std::string summary() const { return ""; }
  virtual nlohmann::ordered_json report() const { return nlohmann::ordered_json::object(); }
};

// What the StageList counted in one step (all forwards of the step, every CFG branch).
struct StepCounts {
  int block_calls = 0, blocks_computed = 0;
  int attention_calls = 0, attention_computed = 0;
};

class StageList : public models::AttentionPolicy, public models::BlockHook {
 public:
  // Throws if an attention stage would come after one that computes the attention itself.
  void add(std::unique_ptr<Stage> stage);
  bool empty() const { return stages_.empty(); }
  bool streams_weights() const;  // any stage's streams_weights()
  const std::vector<std::unique_ptr<Stage>>& stages() const { return stages_; }

  void after_load(models::ParameterTable& parameters);
  void begin_run(const RunInfo& run);
  // Every stage's restart mid-run (a new model takes over), keeping the step counts.
  void restart(const RunInfo& run);
  void before_step(const models::StepInfo& step);
  // The context a forward of this step gets: the chain as policy / hook when a stage uses them.
  models::ForwardContext context(const models::StepInfo& step, DType activations);

  Tensor attend(const models::StepInfo& step, const models::AttentionIdentity& id, const models::AttentionProjection& project,
                const Stream& stream) override;
  models::BlockState run(const models::StepInfo& step, const models::BlockIdentity& id, const models::BlockState& in,
                         const models::BlockCompute& compute, const Stream& stream) override;

  const std::vector<StepCounts>& step_counts() const { return counts_; }
  // Host seconds spent in each stage's own code (its hooks minus the work below it), by stage.
  double stage_seconds(std::size_t stage) const { return seconds_[stage]; }
  // "skipped 3 of 12 block computations and 0 of 12 attention computations": the step's counts.
  static std::string skipped_text(const StepCounts& counts);

 private:
  Tensor attend_from(std::size_t i, const models::StepInfo& step, const models::AttentionIdentity& id,
                     const models::AttentionProjection& project, const Stream& stream);
  models::BlockState run_from(std::size_t i, const models::StepInfo& step, const models::BlockIdentity& id, const models::BlockState& in,
                              const models::BlockCompute& compute, const Stream& stream);
  StepCounts& current();

  std::vector<std::unique_ptr<Stage>> stages_;
  std::vector<double> seconds_;
  std::vector<StepCounts> counts_;  // one per step begun
};

}  // namespace cubevec::pipelines
