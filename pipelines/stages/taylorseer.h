// cache-dit's TaylorSeer calibrator (docs/stages.md, "cache-dit's DBCache and TaylorSeer"; read against
// cache_dit/caching/cache_contexts/calibrators/taylorseer.py): on a computed step t the value Y is
// recorded with its divided differences dY_0 = Y, dY_{i+1} = (dY_i - dY_i^prev) / window (window =
// steps since the last computed step; differences only from step 2 on, as cache-dit's
// `current_step > 1`); on a skipped step t' the value is extrapolated as
// sum_i dY_i (t' - t)^i / i!. Kept in f32 whatever the tensors' dtype.
#pragma once

#include <vector>

#include "device/stream.h"
#include "tensor/tensor.h"

namespace cubevec::pipelines {

class TaylorSeer {
 public:
  explicit TaylorSeer(int order) : order_(order) {}
  int order() const { return order_; }
  bool ready() const { return !current_.empty(); }
  // Y computed at `step`.
  void update(const Tensor& y, int step, const Stream& stream);
  // The extrapolation to `step` (after the last update), in `dtype`.
  Tensor approximate(int step, DType dtype, const Stream& stream) const;

 private:
  int order_;
  int last_step_ = -1;
  std::vector<Tensor> current_, previous_;  // dY_0 .. dY_k of the last and the one before
};

}  // namespace cubevec::pipelines
