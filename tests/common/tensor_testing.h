// Helpers the operator tests share: seeded random data, exact readback as double, closeness
// checks with per-dtype tolerances, and the message of an expected error.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tensor/half.h"
#include "tensor/tensor.h"

namespace cubevec::testing {

// `count` values uniform in [lo, hi), from a fixed seed.
inline std::vector<float> random_values(int64_t count, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(count));
  for (float& x : v) x = dist(rng);
  return v;
}

// Values uniform in [shift - scale, shift + scale], stored as `dtype` (f32, or bf16 / f16 rounded).
inline Tensor random_tensor(const Shape& shape, unsigned seed, DType dtype = DType::f32, float scale = 3.0f, float shift = 0.0f) {
  const std::vector<float> v = random_values(shape_numel(shape), seed, shift - scale, shift + scale);
  if (dtype == DType::f32) return Tensor::from_vector(v, shape);
  Tensor out = Tensor::empty(shape, dtype);
  uint16_t* o = out.mutable_data<uint16_t>();
  for (std::size_t i = 0; i < v.size(); ++i) o[i] = dtype == DType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
  return out;
}

// The same values seen through a non-contiguous view: a transposed copy, transposed back.
inline Tensor strided_copy_of(const Tensor& t) {
  Tensor view = t.transpose(0, t.dim() - 1).contiguous().transpose(0, t.dim() - 1);
  EXPECT_TRUE(t.dim() < 2 || t.size(0) < 2 || t.size(-1) < 2 || !view.is_contiguous());
  return view;
}

// Logical elements in row-major order, exactly, as double (f32, bf16 or f16 tensors).
inline std::vector<double> values(const Tensor& t) {
  if (!t.defined()) return {};
  const Tensor c = t.contiguous();
  std::vector<double> v(static_cast<std::size_t>(c.numel()));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (c.dtype() == DType::f32) v[i] = c.data<float>()[i];
    else if (c.dtype() == DType::bf16) v[i] = bf16_to_f32(c.data<uint16_t>()[i]);
    else v[i] = f16_to_f32(c.data<uint16_t>()[i]);
  }
  return v;
}

struct Tolerance {
  double rtol, atol;
};

// About one unit in the last place of the output dtype, plus a small absolute slack.
inline Tolerance default_tolerance(DType dtype) {
  if (dtype == DType::bf16) return {std::ldexp(1.0, -8), 1e-5};
  if (dtype == DType::f16) return {std::ldexp(1.0, -11), 1e-5};
  return {1e-5, 1e-6};
}

// |got - want| <= rtol |want| + atol element by element, and got has `dtype`.
inline void expect_close(const Tensor& got, const std::vector<double>& want, DType dtype, const std::string& what,
                         std::optional<Tolerance> tolerance = std::nullopt) {
  ASSERT_EQ(got.dtype(), dtype) << what;
  const std::vector<double> g = values(got);
  ASSERT_EQ(g.size(), want.size()) << what;
  const Tolerance tol = tolerance.value_or(default_tolerance(dtype));
  for (std::size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], want[i], tol.rtol * std::fabs(want[i]) + tol.atol) << what << " at " << i;
}

// Scale-relative closeness for whole model outputs: max |got - want| <= rel * max |want| + abs,
// reporting the worst element (a NaN in got fails).
inline void expect_close_rel(const Tensor& got, const Tensor& want, double rel, const std::string& what, double abs = 0.0) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const auto g = values(got), w = values(want);
  double scale = 0, worst = 0;
  std::size_t at = 0;
  for (double x : w) scale = std::max(scale, std::fabs(x));
  for (std::size_t i = 0; i < g.size(); ++i)
    if (std::fabs(g[i] - w[i]) > worst || std::isnan(g[i])) {
      worst = std::isnan(g[i]) ? INFINITY : std::fabs(g[i] - w[i]);
      at = i;
    }
  EXPECT_LE(worst, rel * scale + abs) << what << ": worst at " << at << " got " << g[at] << " expected " << w[at] << " (max |expected| "
                                      << scale << ")";
}

// The message of the cubevec::Error that `action` throws, or "(no error)".
inline std::string message_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace cubevec::testing
