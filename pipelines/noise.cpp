#include "pipelines/noise.h"

#include <cmath>
#include <numbers>
#include <vector>

namespace cubevec::pipelines {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

Tensor gaussian_noise(const Shape& shape, uint64_t seed) {
  const int64_t n = shape_numel(shape);
  std::vector<float> values(static_cast<std::size_t>(n));
  const uint64_t key = splitmix64(seed);
  for (int64_t p = 0; 2 * p < n; ++p) {
    const uint64_t w1 = splitmix64(key + 2 * static_cast<uint64_t>(p) + 1), w2 = splitmix64(key + 2 * static_cast<uint64_t>(p) + 2);
    const double u1 = static_cast<double>((w1 >> 11) + 1) * 0x1.0p-53;
    const double u2 = static_cast<double>(w2 >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)), angle = 2.0 * std::numbers::pi * u2;
    values[static_cast<std::size_t>(2 * p)] = static_cast<float>(r * std::cos(angle));
    if (2 * p + 1 < n) values[static_cast<std::size_t>(2 * p + 1)] = static_cast<float>(r * std::sin(angle));
  }
  return Tensor::from_vector(values, shape);
}

}  // namespace cubevec::pipelines
