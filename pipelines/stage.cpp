#include "pipelines/stage.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "base/error.h"

namespace cubevec::pipelines {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

void StageList::add(std::unique_ptr<Stage> stage) {
  if (stage->uses_attention())
    for (const auto& before : stages_)
      if (before->computes_attention())
        throw Error(stage->name() + " cannot run with " + before->name() + ", which computes the attention itself");
  stages_.push_back(std::move(stage));
  seconds_.push_back(0.0);
}

bool StageList::streams_weights() const {
  return std::any_of(stages_.begin(), stages_.end(), [](const auto& stage) { return stage->streams_weights(); });
}

void StageList::after_load(models::ParameterTable& parameters) {
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    const double t0 = now_s();
    stages_[i]->after_load(parameters);
    seconds_[i] += now_s() - t0;
  }
}

void Stage::after_load_second_model(models::ParameterTable& /*parameters*/) {
  throw Error("the " + name() + " stage works on one transformer; a second expert (transformer_2/) is not supported with it yet");
}

void StageList::begin_run(const RunInfo& run) {
  counts_.clear();
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    const double t0 = now_s();
    stages_[i]->begin_run(run);
    seconds_[i] += now_s() - t0;
  }
}

void StageList::restart(const RunInfo& run) {
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    const double t0 = now_s();
    stages_[i]->restart(run);
    seconds_[i] += now_s() - t0;
  }
}

void StageList::before_step(const models::StepInfo& step) {
  counts_.emplace_back();
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    const double t0 = now_s();
    stages_[i]->before_step(step);
    seconds_[i] += now_s() - t0;
  }
}

models::ForwardContext StageList::context(const models::StepInfo& step, DType activations) {
  models::ForwardContext ctx;
  ctx.step = step;
  ctx.activations = activations;
  ctx.attention = this;  // even without a stage using it: the list counts the calls
  ctx.blocks = this;
  for (const auto& stage : stages_) {
    if (!ctx.sequence) ctx.sequence = stage->sequence_split();
    if (!ctx.tensor) ctx.tensor = stage->tensor_split();
  }
  return ctx;
}

StepCounts& StageList::current() {
  if (counts_.empty()) counts_.emplace_back();  // a forward outside a step (tests)
  return counts_.back();
}

Tensor StageList::attend(const models::StepInfo& step, const models::AttentionIdentity& id, const models::AttentionProjection& project,
                         const Stream& stream) {
  ++current().attention_calls;
  const models::AttentionProjection counted = [&] {
    ++current().attention_computed;
    return project();
  };
  return attend_from(0, step, id, counted, stream);
}

Tensor StageList::attend_from(std::size_t i, const models::StepInfo& step, const models::AttentionIdentity& id,
                              const models::AttentionProjection& project, const Stream& stream) {
  while (i < stages_.size() && !stages_[i]->uses_attention()) ++i;
  if (i == stages_.size()) return models::dense_attention(project(), stream);
  double below = 0;
  const AttendNext next = [&](const models::AttentionProjection& p) {
    const double t0 = now_s();
    Tensor out = attend_from(i + 1, step, id, p, stream);
    below += now_s() - t0;
    return out;
  };
  const double t0 = now_s();
  Tensor out = stages_[i]->attend(step, id, project, stream, next);
  seconds_[i] += now_s() - t0 - below;
  return out;
}

models::BlockState StageList::run(const models::StepInfo& step, const models::BlockIdentity& id, const models::BlockState& in,
                                  const models::BlockCompute& compute, const Stream& stream) {
  ++current().block_calls;
  const models::BlockCompute counted = [&](const models::BlockState& x) {
    ++current().blocks_computed;
    return compute(x);
  };
  return run_from(0, step, id, in, counted, stream);
}

models::BlockState StageList::run_from(std::size_t i, const models::StepInfo& step, const models::BlockIdentity& id,
                                       const models::BlockState& in, const models::BlockCompute& compute, const Stream& stream) {
  while (i < stages_.size() && !stages_[i]->uses_blocks()) ++i;
  if (i == stages_.size()) return compute(in);
  double below = 0;
  const models::BlockCompute next = [&](const models::BlockState& x) {
    const double t0 = now_s();
    models::BlockState out = run_from(i + 1, step, id, x, compute, stream);
    below += now_s() - t0;
    return out;
  };
  const double t0 = now_s();
  models::BlockState out = stages_[i]->run_block(step, id, in, next, stream);
  seconds_[i] += now_s() - t0 - below;
  return out;
}

std::string StageList::skipped_text(const StepCounts& c) {
  char text[160];
  std::snprintf(text, sizeof text, "skipped %d of %d block and %d of %d attention computations", c.block_calls - c.blocks_computed,
                c.block_calls, c.attention_calls - c.attention_computed, c.attention_calls);
  return text;
}

}  // namespace cubevec::pipelines
