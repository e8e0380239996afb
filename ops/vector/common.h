// Shared plumbing of the vector ops (ops/vector/*.cpp): dtype checks with MindIE-style messages,
// preparing inputs (contiguous on the Vector unit, small parameters as f32), splitting rows over
// the Vector unit's threads, and collapsing strided layouts for the elementwise kernels.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ops/vector/kernels.h"
#include "ops/vector_ops.h"
#include "tensor/half.h"

namespace cubevec::ops::detail {

// The kernel storage type of a float tensor; throws "<op>: <what> must be f32 or bf16, got ..."
// for an undefined or other tensor.
vk::Elem float_elem(const Tensor& t, const char* op, const char* what);
inline vk::Elem elem_of(DType dtype) { return dtype == DType::bf16 ? vk::Elem::bf16 : vk::Elem::f32; }

// `t` as a contiguous tensor, copied on `stream`'s Vector unit when it is not.
Tensor contiguous_on(const Tensor& t, const Stream& stream);
// A parameter (weight, bias, ...) checked to be f32 or bf16 (or f16 when allow_f16) and to have
// `shape`, returned contiguous f32 (converted on the Vector unit when needed); undefined stays
// undefined. The messages say "<op>: <what> must have shape <shape_text>, got ...".
Tensor f32_param(const Tensor& t, const Shape& shape, const std::string& shape_text, const char* op, const char* what, const Stream& stream,
                 bool allow_f16 = false);

inline const void* in_ptr(const Tensor& t) { return t.defined() ? t.unsynchronized_data_ptr() : nullptr; }
inline void* out_ptr(const Tensor& t) { return t.unsynchronized_data_ptr(); }
inline const float* f32_ptr(const Tensor& t) { return static_cast<const float*>(in_ptr(t)); }
inline double bytes_of(const Tensor& t) { return t.defined() ? static_cast<double>(t.nbytes()) : 0.0; }
// Element i of an f32 or bf16 buffer as f32, and its store (rounded to nearest even for bf16): for
// the plain-loop kernels that take either dtype.
inline float load_float(const void* base, DType dtype, int64_t i) {
  return dtype == DType::bf16 ? bf16_to_f32(static_cast<const uint16_t*>(base)[i]) : static_cast<const float*>(base)[i];
}
inline void store_float(void* base, DType dtype, int64_t i, float x) {
  if (dtype == DType::bf16) static_cast<uint16_t*>(base)[i] = f32_to_bf16(x);
  else static_cast<float*>(base)[i] = x;
}

// Runs fn(begin, end) over [0, count) in chunks of at least ~16K elements of work (each item
// costing `item_elements`) on the calling unit's threads; small jobs run inline.
void parallel_chunks(int64_t count, int64_t item_elements, const std::function<void(int64_t, int64_t)>& fn);

// A strided iteration space with the dims that can be merged merged: for every operand, adjacent
// dims d, d+1 merge when stride[d] == stride[d+1] * size[d+1]; size-1 dims vanish. At least one dim.
struct CollapsedLayout {
  Shape shape;
  std::vector<Strides> strides;  // per operand
};
CollapsedLayout collapse(const Shape& shape, std::vector<Strides> strides);

}  // namespace cubevec::ops::detail
