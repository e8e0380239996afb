// LoRA at run time: an adapter's deltas computed beside each layer's own product instead of fused
// into its weight, y = layer(x) + sum_i factor_i (x A_i^T) B_i^T (+ scale diff_b_i), so the weights
// stay as they loaded (quantized int8 Linears included) and one resident model can serve each
// request with its own LoRAs. Installed per thread through models/layers.h's LinearCallHook: a
// RuntimeLoraScope makes a RuntimeLora the calling thread's for its lifetime, and every Linear call
// of that thread that the LoRA touches goes through it; other threads (concurrent requests) are not
// affected.
//
// A float layer's deltas are stacked into one A [R, in] and one (factor B)^T [R, out]: x A^T is a
// thin GEMM, and the layer's own GEMM adds (x A^T)(factor B)^T to each finished tile before its
// activation (the epilogue's low-rank update), so the LoRA makes no pass over the layer's output.
// A kernel layer (int8) and a bias difference take the general path: each delta's (x A^T) B^T is
// its own GEMM whose epilogue carries the running sum (residual + gate d), the layer's GEMM then
// adding it as its residual; under an activation the sum goes in unactivated and the activation
// follows on the Vector unit.
#pragma once

#include <unordered_map>
#include <vector>

#include "models/layers.h"
#include "models/lora.h"

namespace cubevec::models {

class RuntimeLora : public LinearCallHook {
 public:
  // Adds resolve_lora's deltas (several adapters add up, in order).
  void add(const std::vector<LoraDelta>& deltas);
  bool empty() const { return by_layer_.empty(); }
  int layers() const { return static_cast<int>(by_layer_.size()); }  // Linears with a delta
  int64_t total_rank() const { return total_rank_; }                 // summed over every delta
  // rank (in + out) per delta, summed: the deltas' multiply-adds per row of x.
  double macs_per_row() const { return macs_per_row_; }

  Tensor call(const Linear& layer, const Tensor& x, const Stream& stream, const ops::MatmulOptions& epilogue) const override;

 private:
  struct Delta {
    Tensor down_f32, down_bf16;  // A [rank, in]
    Tensor up;                   // factor * B [out, rank], f32
    Tensor bias_f32, bias_bf16;  // scale * diff_b [out], or undefined
  };
  struct LayerDeltas {
    std::vector<Delta> deltas;
    Tensor down_f32, down_bf16;  // every delta's A stacked [R, in]
    Tensor up_t;                 // every delta's (factor B)^T stacked [R, out], f32
    bool has_bias = false;
  };
  Tensor general_path(const Linear& layer, const LayerDeltas& deltas, const Tensor& x, const Stream& stream,
                      const ops::MatmulOptions& epilogue) const;
  std::unordered_map<const Linear*, LayerDeltas> by_layer_;
  int64_t total_rank_ = 0;
  double macs_per_row_ = 0;
};

// Makes `lora` the calling thread's LinearCallHook until the scope ends (then the previous one);
// null or an empty LoRA leaves the thread as it is.
class RuntimeLoraScope {
 public:
  explicit RuntimeLoraScope(const RuntimeLora* lora);
  ~RuntimeLoraScope();
  RuntimeLoraScope(const RuntimeLoraScope&) = delete;
  RuntimeLoraScope& operator=(const RuntimeLoraScope&) = delete;

 private:
  const LinearCallHook* previous_;
};

}  // namespace cubevec::models
