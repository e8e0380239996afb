#include "models/input_checks.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/error.h"
#include "tensor/half.h"

namespace cubevec::models {

void require_input_dtype(const Tensor& t, const std::string& where, const std::string& name, std::initializer_list<DType> allowed) {
  if (!t.defined() || std::find(allowed.begin(), allowed.end(), t.dtype()) != allowed.end()) return;
  std::string list;
  std::size_t i = 0;
  for (DType d : allowed) {
    list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + std::string(dtype_name(d));
    ++i;
  }
  throw Error(where + ": " + name + " must be " + list + ", got " + std::string(dtype_name(t.dtype())) + " " + shape_to_string(t.shape()));
}

void require_finite_values(const Tensor& t, const std::string& where, const std::string& name, double scale) {
  if (!t.defined() || !t.has_storage() || !(t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16)) return;
  const Tensor values = t.contiguous();
  for (int64_t i = 0; i < values.numel(); ++i) {
    const float value = values.dtype() == DType::f32    ? values.data<float>()[i]
                        : values.dtype() == DType::bf16 ? bf16_to_f32(values.data<uint16_t>()[i])
                                                        : f16_to_f32(values.data<uint16_t>()[i]);
    const double scaled = static_cast<double>(value) * scale;
    if (std::isfinite(scaled) && std::abs(scaled) <= std::numeric_limits<float>::max()) continue;
    throw Error(where + ": " + name + " holds " + std::to_string(value) + " at element " + std::to_string(i) + " of " +
                shape_to_string(t.shape()) + "; expected finite values" +
                (scale == 1.0 ? std::string() : " (the model multiplies them by " + std::to_string(static_cast<int64_t>(scale)) + ")"));
  }
}

}  // namespace cubevec::models
