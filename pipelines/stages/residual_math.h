// The residual arithmetic the step caches share: tensors that may be undefined (a block that was
// not run on this branch leaves nothing to add or subtract).
#pragma once

#include "ops/vector_ops.h"

namespace cubevec::pipelines {

// a + b, or a unchanged when either is undefined.
inline Tensor add_if(const Tensor& a, const Tensor& b, const Stream& s) { return a.defined() && b.defined() ? ops::add(a, b, s) : a; }
// a - b, or an undefined tensor when either is undefined.
inline Tensor sub_if(const Tensor& a, const Tensor& b, const Stream& s) {
  return a.defined() && b.defined() ? ops::sub(a, b, s) : Tensor();
}

}  // namespace cubevec::pipelines
