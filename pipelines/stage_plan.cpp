#include "pipelines/stage_plan.h"

#include "pipelines/stages/quant_attention.h"
#include "pipelines/stages/sequence_parallel.h"
#include "pipelines/stages/tensor_parallel.h"
#include "base/error.h"

namespace cubevec::pipelines {

namespace {

// A stage the loaded pipeline owns, in one request's list.
class LentStage : public Stage {
 public:
  explicit LentStage(Stage& stage) : s_(stage) {}
  std::string name() const override { return s_.name(); }
  void after_load(models::ParameterTable&) override {}  // applied once, at load
  void begin_run(const RunInfo& run) override { s_.begin_run(run); }
  void before_step(const models::StepInfo& step) override { s_.before_step(step); }
  bool uses_attention() const override { return s_.uses_attention(); }
  bool computes_attention() const override { return s_.computes_attention(); }
  Tensor attend(const models::StepInfo& step, const models::AttentionIdentity& id, const models::AttentionProjection& project,
                const Stream& stream, const AttendNext& next) override {
    return s_.attend(step, id, project, stream, next);
  }
  bool uses_blocks() const override { return s_.uses_blocks(); }
  models::BlockState run_block(const models::StepInfo& step, const models::BlockIdentity& id, const models::BlockState& in,
                               const models::BlockCompute& compute, const Stream& stream) override {
    return s_.run_block(step, id, in, compute, stream);
  }
  models::SequenceSplit* sequence_split() override { return s_.sequence_split(); }
  models::TensorSplit* tensor_split() override { return s_.tensor_split(); }
  std::string summary() const override { return s_.summary(); }
  nlohmann::ordered_json report() const override { return s_.report(); }

 private:
  Stage& s_;
};

std::unique_ptr<Stage> lend(const std::unique_ptr<Stage>& stage) { return stage ? std::make_unique<LentStage>(*stage) : nullptr; }

}  // namespace

StageList build_stage_list(std::unique_ptr<Stage> quantize, const CacheConfig& cache_config, int steps, int blocks,
                           std::unique_ptr<SparseAttentionStage> sparse, std::unique_ptr<Stage> offload,
                           std::unique_ptr<Stage> sequence_parallel, std::unique_ptr<Stage> tensor_parallel,
                           std::unique_ptr<Stage> quant_attention) {
  StageList stages;
  if (tensor_parallel) {
    if (quantize) throw Error("--quant with --tp is not supported yet: the quantized layers would need their shards too");
    stages.add(std::move(tensor_parallel));  // first: its after_load cuts the weights the others see
  }
  if (offload) stages.add(std::move(offload));  // outermost of the block hooks: it sees every block, replayed or not
  const bool sharded = sequence_parallel != nullptr;
  if (sequence_parallel) stages.add(std::move(sequence_parallel));
  if (quantize) stages.add(std::move(quantize));
  if (auto cache = make_cache_stage(cache_config, steps, blocks)) {
    // A cache decides from what its rank sees; with the tokens shared, ranks could decide apart.
    if (sharded) throw Error("--cache with --ulysses or --ring is not supported yet: each rank would decide its cache from its own tokens");
    stages.add(std::move(cache));
  }
  if (sparse && quant_attention)
    throw Error(
        "--quant-attention with --sparse is not supported yet: the block-sparse kernel computes its attention in its own precision, "
        "so int8 would reach only the modules it leaves dense");
  if (sparse) {
    sparse->check_blocks(blocks);
    sparse->check_steps(steps);
    stages.add(std::move(sparse));
  }
  if (quant_attention) stages.add(std::move(quant_attention));
  return stages;
}

void LoadStages::after_load(models::ParameterTable& parameters) {
  // The combinations the list refuses (quantization with tensor parallelism) fail here, before any swap.
  const StageList order = build_stage_list(lend(quantize), CacheConfig{}, 1, 1, nullptr, lend(offload), nullptr, lend(tensor_parallel));
  for (Stage* stage : {tensor_parallel.get(), offload.get(), quantize.get()})
    if (stage) stage->after_load(parameters);
}

void LoadStages::after_load_second_model(models::ParameterTable& parameters) {
  for (Stage* stage : {tensor_parallel.get(), offload.get(), quantize.get()})
    if (stage) stage->after_load_second_model(parameters);
}

StageList request_stages(const LoadStages& shared, const Request& request, int blocks, std::unique_ptr<Stage> sequence_parallel,
                         bool simulate) {
  if (!request.num_inference_steps) throw Error("internal: request_stages needs the request's step count (its defaults filled in)");
  const std::optional<SparseConfig>& sparse = request.sparse;
  std::unique_ptr<Stage> quant_attention;
  if (request.quant_attention != AttentionQuant::none)
    quant_attention = std::make_unique<QuantAttentionStage>(request.quant_attention, simulate);
  return build_stage_list(lend(shared.quantize), request.cache, *request.num_inference_steps, blocks,
                          sparse ? std::make_unique<SparseAttentionStage>(*sparse) : nullptr, lend(shared.offload),
                          std::move(sequence_parallel), lend(shared.tensor_parallel), std::move(quant_attention));
}

void check_heads(const parallel::ParallelGroups& groups, int64_t heads) {
  const int u = groups.degrees.ulysses, t = groups.degrees.tp;
  if (heads % (u * t) == 0) return;
  if (t == 1)
    throw Error("--ulysses " + std::to_string(u) + " must divide the transformer's " + std::to_string(heads) +
                " attention heads (each rank attends with heads / U of them)");
  if (u == 1)
    throw Error("--tp " + std::to_string(t) + " must divide the transformer's " + std::to_string(heads) +
                " attention heads (each rank computes heads / T of them)");
  throw Error("--ulysses " + std::to_string(u) + " x --tp " + std::to_string(t) + " = " + std::to_string(u * t) +
              " must divide the transformer's " + std::to_string(heads) +
              " attention heads (each rank attends with heads / (U x T) of them)");
}

std::unique_ptr<Stage> sequence_parallel_stage(const parallel::ParallelGroups& groups) {
  if (groups.degrees.sequence() == 1) return nullptr;
  return std::make_unique<SequenceParallelStage>(groups.ulysses, groups.ring);
}

std::unique_ptr<Stage> tensor_parallel_stage(const parallel::ParallelGroups& groups, const models::TensorParallelPlan& plan) {
  if (groups.degrees.tp == 1) return nullptr;
  return std::make_unique<TensorParallelStage>(groups.tp, plan);
}

}  // namespace cubevec::pipelines
