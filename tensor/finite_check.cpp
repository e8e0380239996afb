#include "tensor/finite_check.h"

#include <cmath>

#include "base/error.h"
#include "tensor/half.h"

namespace cubevec {

namespace {

template <typename Bits, typename ToFloat>
std::optional<int64_t> scan(const Bits* p, int64_t n, ToFloat to_float) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(to_float(p[i]))) return i;
  return std::nullopt;
}

std::string index_text(const Shape& shape, int64_t flat) {
  std::string text;
  for (std::size_t d = shape.size(); d-- > 0;) {
    const int64_t size = std::max<int64_t>(shape[d], 1);
    text = std::to_string(flat % size) + (text.empty() ? "" : ", ") + text;
    flat /= size;
  }
  return "[" + text + "]";
}

}  // namespace

std::optional<int64_t> first_non_finite(const Tensor& t) {
  if (!t.defined() || !t.has_storage() || t.numel() == 0) return std::nullopt;
  const Tensor c = t.contiguous();
  const int64_t n = c.numel();
  switch (c.dtype()) {
    case DType::f32: return scan(static_cast<const float*>(c.data_ptr()), n, [](float x) { return x; });
    case DType::bf16: return scan(static_cast<const uint16_t*>(c.data_ptr()), n, bf16_to_f32);
    case DType::f16: return scan(static_cast<const uint16_t*>(c.data_ptr()), n, f16_to_f32);
    default: return std::nullopt;
  }
}

void require_finite(const Tensor& t, const std::string& what) {
  const std::optional<int64_t> bad = first_non_finite(t);
  if (!bad) return;
  const Tensor c = t.contiguous();
  float value = 0;
  if (c.dtype() == DType::f32) value = static_cast<const float*>(c.data_ptr())[*bad];
  else if (c.dtype() == DType::bf16) value = bf16_to_f32(static_cast<const uint16_t*>(c.data_ptr())[*bad]);
  else value = f16_to_f32(static_cast<const uint16_t*>(c.data_ptr())[*bad]);
  throw Error(what + ": element " + index_text(c.shape(), *bad) + " is " +
              (std::isnan(value) ? "nan"
               : value > 0       ? "inf"
                                 : "-inf") +
              " (expected finite values)");
}

}  // namespace cubevec
