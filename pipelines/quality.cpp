#include "pipelines/quality.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/vector_ops.h"
#include "base/error.h"

namespace cubevec::pipelines {

Quality compare_pictures(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape())
    throw Error("compare_pictures: shapes " + shape_to_string(a.shape()) + " and " + shape_to_string(b.shape()) + " differ");
  const Tensor x = ops::cast(a, DType::f32).contiguous(), y = ops::cast(b, DType::f32).contiguous();
  const float *p = x.data<float>(), *q = y.data<float>();
  double sum = 0, worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double u = std::clamp(p[i] / 2.0 + 0.5, 0.0, 1.0), v = std::clamp(q[i] / 2.0 + 0.5, 0.0, 1.0);
    sum += (u - v) * (u - v);
    worst = std::max(worst, std::abs(u - v));
  }
  const double mse = x.numel() > 0 ? sum / static_cast<double>(x.numel()) : 0.0;
  return {mse == 0 ? std::numeric_limits<double>::infinity() : 10 * std::log10(1.0 / mse), worst};
}

}  // namespace cubevec::pipelines
