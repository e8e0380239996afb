// A plain double-precision attention loop and its helpers, the reference of the attention tests
// (tests/ops/attention_test.cpp, block_sparse_attention_test.cpp, sparse_attention_test.cpp).
//
// Tolerances of expect_matches (ref = the double loop on the same, possibly bf16-rounded, inputs;
// M = max |ref|):
//   f32:  |got - ref| <= 1e-5 * sqrt(Sk + D) * max(1, M)
//   bf16: |got - ref| <= 2^-7 * max(1, M)  (one rounding of the output plus the f32 sums)
//   rows with no key to attend to must be NaN in both.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/attention.h"
#include "tensor/tensor.h"

#include "common/tensor_testing.h"

namespace cubevec::testing {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Options that run `impl` with q, k, v handed to it in `kernel_layout` (opt_mode manual).
// `impls` plus flash_bf16 where this CPU runs it and the activations are bf16 (for f32 inputs it
// rounds them to bf16, beyond the f32 tolerances the tests hold the other implementations to).
inline std::vector<ops::AttentionImpl> with_flash_bf16(std::vector<ops::AttentionImpl> impls, DType dtype) {
  if (dtype == DType::bf16 && ops::attention_impl_available(ops::AttentionImpl::flash_bf16))
    impls.push_back(ops::AttentionImpl::flash_bf16);
  return impls;
}

inline ops::AttentionOptions manual(ops::AttentionImpl impl, ops::AttentionLayout kernel_layout = ops::AttentionLayout::bnsd) {
  ops::AttentionOptions o;
  o.opt_mode = ops::AttentionOptMode::manual;
  o.op_type = impl;
  o.kernel_layout = kernel_layout;
  return o;
}

// One head in plain arrays (double), the reference's view.
struct RefHead {
  int64_t sq, sk, d;
  const double* q;  // [sq, d]
  const double* k;  // [sk, d]
  const double* v;
  const uint8_t* mask;  // [sq, sk] or null
  bool causal;
};

// The double loop over one head (softmax(q k^T * scale) v; rows with nothing to attend to are NaN).
// Defined in attention_reference.cpp, compiled optimized in every tree (see tests/CMakeLists.txt).
std::vector<double> reference_head(const RefHead& h, double scale);

inline void expect_matches(const std::vector<double>& got, const std::vector<double>& want, DType dtype, int64_t sk, int64_t d,
                           const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double m = 1.0;
  for (double x : want)
    if (!std::isnan(x)) m = std::max(m, std::fabs(x));
  const double tol = dtype == DType::bf16 ? std::ldexp(1.0, -7) * m : 1e-5 * std::sqrt(double(sk + d)) * m;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(got[i])) << what << " at " << i << ": expected NaN, got " << got[i];
    } else {
      ASSERT_NEAR(got[i], want[i], tol) << what << " at " << i;
    }
  }
}

// q, k, v in BSND as random tensors, and their values as double.
struct Qkv {
  Tensor q, k, v;
  std::vector<double> qd, kd, vd;
};

inline Qkv make_qkv(int64_t b, int64_t sq, int64_t sk, int64_t n, int64_t d, DType dtype, unsigned seed) {
  Qkv x;
  x.q = random_tensor({b, sq, n, d}, seed, dtype, 2.0f);
  x.k = random_tensor({b, sk, n, d}, seed + 1, dtype, 2.0f);
  x.v = random_tensor({b, sk, n, d}, seed + 2, dtype, 1.0f);
  x.qd = values(x.q);
  x.kd = values(x.k);
  x.vd = values(x.v);
  return x;
}

// Head (bi, ni) of a BSND tensor's values as a contiguous [s, d] block.
std::vector<double> head_of(const std::vector<double>& all, int64_t bi, int64_t ni, int64_t s, int64_t n, int64_t d);

// The reference for BSND inputs, with an optional [B|1, N|1, Sq, Sk] mask (as bytes).
std::vector<double> reference_bsnd(const Qkv& x, int64_t b, int64_t sq, int64_t sk, int64_t n, int64_t d, const std::vector<uint8_t>* mask,
                                   int64_t mb, int64_t mn, double scale);

inline Tensor bool_tensor(const std::vector<uint8_t>& bytes, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::boolean);
  std::memcpy(t.mutable_data_ptr(), bytes.data(), bytes.size());
  return t;
}

inline std::vector<uint8_t> random_mask(int64_t count, unsigned seed, double p_attend) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution attend(p_attend);
  std::vector<uint8_t> m(static_cast<std::size_t>(count));
  for (auto& x : m) x = attend(rng) ? 1 : 0;
  return m;
}

}  // namespace cubevec::testing
