// Which acceleration stages a generation runs, in which order, and which of them belong to the
// loaded model rather than to one request.
//
// Order: tensor parallelism first (its after_load cuts the weights the others see), then offload
// (outermost of the block hooks: it sees every block, replayed or not), sequence parallelism (the
// attention stages below it see every token for this rank's heads), quantization, the step cache,
// sparse attention (a replayed attention skips it), quantized attention (what sparse attention
// leaves dense).
//
// Tensor parallelism, offload and quantization change the weights at load, so a loaded pipeline
// makes them once (LoadStages) and lends them to every request; the step cache and sparse
// attention keep per-request state (residuals, TaylorSeer's history, masks), so each request gets
// new ones.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/tensor_parallel_plan.h"
#include "parallel/plan.h"
#include "pipelines/request.h"
#include "pipelines/stage.h"
#include "pipelines/stages/cache_config.h"
#include "pipelines/stages/sparse_attention.h"

namespace cubevec::pipelines {

// The stages for a run of `steps` steps over `blocks` blocks in the order above, validated (errors
// name the flag).
StageList build_stage_list(std::unique_ptr<Stage> quantize, const CacheConfig& cache, int steps, int blocks,
                           std::unique_ptr<SparseAttentionStage> sparse = nullptr, std::unique_ptr<Stage> offload = nullptr,
                           std::unique_ptr<Stage> sequence_parallel = nullptr, std::unique_ptr<Stage> tensor_parallel = nullptr,
                           std::unique_ptr<Stage> quant_attention = nullptr);

// The stages a loaded model owns. after_load applies them to the weights, once.
struct LoadStages {
  std::unique_ptr<Stage> tensor_parallel, offload, quantize;
  void after_load(models::ParameterTable& parameters);
  // A second expert's weights, after after_load of the first's.
  void after_load_second_model(models::ParameterTable& parameters);
};

// A request's stages: `shared`'s lent (not owned: they outlive the request), the cache, sparse and
// quantized attention new, validated against the run (the request's defaults filled in: its step
// count is set). `simulate`: a shape-only run, which may price kernels this CPU lacks.
StageList request_stages(const LoadStages& shared, const Request& request, int blocks, std::unique_ptr<Stage> sequence_parallel,
                         bool simulate);

// Throws, before any weight loads, unless the Ulysses x tensor-parallel degree divides the
// transformer's `heads`.
void check_heads(const parallel::ParallelGroups& groups, int64_t heads);
// The sequence-parallel stage (Ulysses and ring), or null when each rank holds every token.
std::unique_ptr<Stage> sequence_parallel_stage(const parallel::ParallelGroups& groups);
// The tensor-parallel stage cutting the layers of `plan`, or null without tensor parallelism.
std::unique_ptr<Stage> tensor_parallel_stage(const parallel::ParallelGroups& groups, const models::TensorParallelPlan& plan);

}  // namespace cubevec::pipelines
