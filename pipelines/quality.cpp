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

Quality compare_pixels(const std::vector<media::RgbImage>& a, const std::vector<media::RgbImage>& b) {
  if (a.size() != b.size())
    throw Error("compare_pixels: " + std::to_string(a.size()) + " and " + std::to_string(b.size()) + " frames differ in number");
  double sum = 0, worst = 0;
  std::size_t n = 0;
  for (std::size_t f = 0; f < a.size(); ++f) {
    if (a[f].width != b[f].width || a[f].height != b[f].height)
      throw Error("compare_pixels: frame " + std::to_string(f) + " is " + std::to_string(a[f].width) + "x" + std::to_string(a[f].height) +
                  " against " + std::to_string(b[f].width) + "x" + std::to_string(b[f].height));
    for (std::size_t i = 0; i < a[f].pixels.size(); ++i) {
      const double d = (double(a[f].pixels[i]) - double(b[f].pixels[i])) / 255.0;
      sum += d * d;
      worst = std::max(worst, std::abs(d));
    }
    n += a[f].pixels.size();
  }
  const double mse = n > 0 ? sum / static_cast<double>(n) : 0.0;
  return {mse == 0 ? std::numeric_limits<double>::infinity() : 10 * std::log10(1.0 / mse), worst};
}

}  // namespace cubevec::pipelines
