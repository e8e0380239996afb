#include "ops/op_stream.h"

namespace cubevec::ops {

void require_contiguous_f32(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) throw Error(std::string(op) + ": " + what + " is undefined");
  if (t.dtype() != DType::f32 || !t.is_contiguous())
    throw Error(std::string(op) + ": " + what + " must be a contiguous f32 tensor, got " + t.describe());
}

}  // namespace cubevec::ops
