// GEMM backends against an independent double-precision loop, on odd sizes.
#include "ops/gemm.h"

#include <gtest/gtest.h>

#include <random>

namespace cubevec {
namespace {

Tensor random_tensor(const Shape& shape, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape);
}

// c[i][j] = sum_p a[i][p] b[p][j] + bias[j], in double, written here independently of ops/.
std::vector<double> expected_product(const Tensor& a, const Tensor& b, const Tensor& bias) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  std::vector<double> c(static_cast<std::size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = bias.defined() ? bias.at<float>({j}) : 0.0;
      for (int64_t p = 0; p < k; ++p) s += double(a.at<float>({i, p})) * b.at<float>({p, j});
      c[static_cast<std::size_t>(i * n + j)] = s;
    }
  return c;
}

TEST(Gemm, BackendsMatchTheDoubleLoopOnOddSizes) {
  const int64_t sizes[][3] = {{1, 1, 1}, {7, 17, 5}, {17, 7, 129}, {129, 33, 64}, {64, 1, 300}, {33, 65, 1}};
  for (const auto& s : sizes) {
    const Tensor a = random_tensor({s[0], s[2]}, 1), b = random_tensor({s[2], s[1]}, 2), bias = random_tensor({s[1]}, 3);
    for (bool with_bias : {false, true}) {
      const auto want = expected_product(a, b, with_bias ? bias : Tensor());
      for (auto backend : {ops::GemmBackend::openblas, ops::GemmBackend::reference}) {
        const Tensor c = ops::matmul(a, b, with_bias ? bias : Tensor(), backend);
        ASSERT_EQ(c.shape(), (Shape{s[0], s[1]}));
        const float* got = c.data<float>();
        // f32 accumulation over K terms of size <= 1: error grows like K * eps.
        const double tolerance = 1e-6 * static_cast<double>(s[2]) + 1e-6;
        for (std::size_t i = 0; i < want.size(); ++i)
          ASSERT_NEAR(got[i], want[i], tolerance) << "M,N,K=" << s[0] << "," << s[1] << "," << s[2] << " at " << i;
      }
    }
  }
}

TEST(Gemm, RejectsBadShapesAndLayouts) {
  const Tensor a = random_tensor({4, 3}, 1), b = random_tensor({5, 2}, 2);
  try {
    ops::matmul(a, b);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected A [M, K] and B [K, N], got A [4, 3] and B [5, 2]"), std::string::npos);
  }
  const Tensor bt = random_tensor({2, 3}, 3).transpose(0, 1);
  try {
    ops::matmul(a, bt);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("B must be a contiguous f32 tensor"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::matmul(a, random_tensor({3, 2}, 4), random_tensor({3}, 5)), Error);
  EXPECT_THROW(ops::parse_gemm_backend("mkl"), Error);
}

}  // namespace
}  // namespace cubevec
