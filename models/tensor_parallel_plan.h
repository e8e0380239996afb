// Which layers of a transformer tensor parallelism shards (Megatron-style, as MindIE SD's
// ColumnParallelLinear / RowParallelLinear mark them), declared by the model that knows them:
//   - column Linears (q, k, v, MLP in): output features split in T contiguous parts, so each rank
//     computes its share of the heads / hidden units; no communication;
//   - row Linears (attention out, MLP out): input features split the same way; each rank's partial
//     product is all-reduced and the bias added once;
//   - channel vectors (Wan's q / k RMSNorm weights over all heads' channels): split like the column
//     Linears' outputs; the norm's sum of squares is all-reduced (ForwardContext::rms_norm_across_heads).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cubevec::models {

struct TensorParallelPlan {
  int64_t heads = 0;                // attention heads of every layer (T must divide them)
  std::vector<std::string> column;  // Linear module names
  struct RowLinear {
    std::string module;
    // The input features as consecutive segments, each split in T parts; rank r takes part r of every
    // segment (Flux's single-block proj_out reads [attention; MLP]). Empty: one segment, all inputs.
    std::vector<int64_t> segments;
  };
  std::vector<RowLinear> row;
  std::vector<std::string> channel_vectors;  // parameter names
};

}  // namespace cubevec::models
