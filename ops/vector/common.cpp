#include "ops/vector/common.h"

#include <algorithm>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

namespace cubevec::ops::detail {

vk::Elem float_elem(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) throw Error(std::string(op) + ": " + what + " is undefined (expected an f32 or bf16 tensor)");
  if (t.dtype() != DType::f32 && t.dtype() != DType::bf16)
    throw Error(std::string(op) + ": " + what + " must be f32 or bf16, got " + t.brief());
  return elem_of(t.dtype());
}

Tensor contiguous_on(const Tensor& t, const Stream& stream) { return ops::contiguous(t, stream); }

Tensor f32_param(const Tensor& t, const Shape& shape, const std::string& shape_text, const char* op, const char* what, const Stream& stream,
                 bool allow_f16) {
  if (!t.defined()) return t;
  if (t.dtype() != DType::f32 && t.dtype() != DType::bf16 && !(allow_f16 && t.dtype() == DType::f16))
    throw Error(std::string(op) + ": " + what + " must be f32 or bf16" + (allow_f16 ? " (or f16)" : "") + ", got " + t.brief());
  if (t.shape() != shape)
    throw Error(std::string(op) + ": " + what + " must have shape " + shape_text + ", got " + shape_to_string(t.shape()));
  return t.dtype() == DType::f32 ? contiguous_on(t, stream) : ops::cast(t, DType::f32, stream);
}

void parallel_chunks(int64_t count, int64_t item_elements, const std::function<void(int64_t, int64_t)>& fn) {
  constexpr int64_t kChunkElements = 16384;
  if (count <= 0) return;
  const int64_t per_item = item_elements > 0 ? item_elements : 1;
  if (count == 1 || count * per_item <= 2 * kChunkElements) {
    fn(0, count);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kChunkElements / per_item);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, count, grain), [&](const tbb::blocked_range<int64_t>& r) { fn(r.begin(), r.end()); });
}

CollapsedLayout collapse(const Shape& shape, std::vector<Strides> strides) {
  CollapsedLayout out;
  out.strides.resize(strides.size());
  // Built innermost first, reversed at the end.
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    const int64_t size = shape[d];
    if (size == 1) continue;
    bool merge = !out.shape.empty();
    for (std::size_t k = 0; merge && k < strides.size(); ++k) merge = strides[k][d] == out.strides[k].back() * out.shape.back();
    if (merge) {
      out.shape.back() *= size;
    } else {
      out.shape.push_back(size);
      for (std::size_t k = 0; k < strides.size(); ++k) out.strides[k].push_back(strides[k][d]);
    }
  }
  if (out.shape.empty()) {
    out.shape.push_back(1);
    for (auto& s : out.strides) s.push_back(1);
  }
  std::reverse(out.shape.begin(), out.shape.end());
  for (auto& s : out.strides) std::reverse(s.begin(), s.end());
  return out;
}

}  // namespace cubevec::ops::detail
