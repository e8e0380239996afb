// Tensor parallelism (Megatron-style, as MindIE SD's ColumnParallelLinear / RowParallelLinear): the
// T ranks of the tp group share every block's heads and MLP units. After load, the layers the
// model's TensorParallelPlan names are cut to this rank's share:
//   - column Linears keep rows [r out / T, (r + 1) out / T) of their weight and bias;
//   - row Linears keep the matching input columns (segment by segment) and get a kernel that
//     all-reduces the partial products over the group, then adds the bias once and applies the
//     layer's epilogue (the gated residual of a DiT block);
//   - channel vectors (Wan's q / k RMSNorm weights) keep their share; the norm's sums of squares are
//     all-reduced (rms_norm_across_heads, the model's TensorSplit plug point).
// Attention then runs on heads / T heads per rank with no change; Ulysses and ring split those
// further. The head count and every split width must divide by T (an error naming the layer).
#pragma once

#include <memory>

#include "models/tensor_parallel_plan.h"
#include "parallel/communicator.h"
#include "pipelines/stage.h"

namespace cubevec::pipelines {

class TensorParallelStage : public Stage, public models::TensorSplit {
 public:
  TensorParallelStage(parallel::Communicator group, models::TensorParallelPlan plan);

  std::string name() const override { return "tensor parallel x" + std::to_string(group_.size()); }
  void after_load(models::ParameterTable& parameters) override;
  // Two experts (Wan2.2 A14B): the second is cut by the same plan (the experts share one module tree).
  void after_load_second_model(models::ParameterTable& parameters) override { after_load(parameters); }
  models::TensorSplit* tensor_split() override { return group_.size() > 1 ? this : nullptr; }
  Tensor rms_norm_across_heads(const Tensor& x, const Tensor& weight, float eps, const Stream& stream) override;

  std::string summary() const override;
  nlohmann::ordered_json report() const override;

  struct Counts {
    int64_t all_reduces = 0;
  };

 private:
  parallel::Communicator group_;
  models::TensorParallelPlan plan_;
  int64_t column_layers_ = 0, row_layers_ = 0, vectors_ = 0;
  std::shared_ptr<Counts> counts_ = std::make_shared<Counts>();  // shared with the row kernels
};

}  // namespace cubevec::pipelines
