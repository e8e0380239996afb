// GEMM: every micro-kernel ISA this CPU has, every backend and every fused epilogue, against a
// double-precision loop written here, on odd sizes (edge tiles in both directions) and threads.
#include "ops/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/tensor_testing.h"
#include "ops/vector_ops.h"

namespace cubevec {
namespace gemm_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

using ops::gemm::Activation;
using ops::gemm::Isa;

struct Case {
  int64_t m, n, k;
};

// The expected C, in double, from the definitions in ops/gemm.h.
std::vector<double> expected(const Case& s, const std::vector<float>& a, const std::vector<float>& b, bool trans_b, const float* bias,
                             Activation act, const float* residual, const float* gate) {
  std::vector<double> c(static_cast<std::size_t>(s.m * s.n));
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double x = 0;
      for (int64_t q = 0; q < s.k; ++q) x += double(a[i * s.k + q]) * (trans_b ? b[j * s.k + q] : b[q * s.n + j]);
      if (bias) x += bias[j];
      if (act == Activation::gelu_tanh) x = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
      if (act == Activation::silu) x = x / (1 + std::exp(-x));
      if (residual) x = residual[i * s.n + j] + (gate ? gate[j] : 1.0) * x;
      c[static_cast<std::size_t>(i * s.n + j)] = x;
    }
  return c;
}

const Case kCases[] = {{1, 1, 1}, {7, 17, 5}, {17, 7, 129}, {29, 65, 300}, {64, 1, 77}, {3, 100, 1}, {45, 33, 0}, {130, 70, 513}};

TEST(GemmKernels, EveryIsaMatchesTheDoubleLoop) {
  for (Isa isa : {Isa::avx512, Isa::avx2, Isa::portable}) {
    if (!ops::gemm::isa_supported(isa)) {
      std::printf("note: %s not supported here, skipped\n", std::string(ops::gemm::isa_name(isa)).c_str());
      continue;
    }
    for (const Case& s : kCases)
      for (bool trans_b : {false, true})
        for (int threads : {1, 3}) {
          const auto a = random_values(s.m * s.k, 1), b = random_values(s.k * s.n, 2);
          const auto bias = random_values(s.n, 3), residual = random_values(s.m * s.n, 4), gate = random_values(s.n, 5);
          for (int variant = 0; variant < 5; ++variant) {
            const float* bias_p = variant >= 1 ? bias.data() : nullptr;
            const Activation act = variant == 2 ? Activation::gelu_tanh : variant == 3 ? Activation::silu : Activation::none;
            const float* res_p = variant == 4 ? residual.data() : nullptr;
            const float* gate_p = variant == 4 ? gate.data() : nullptr;
            std::vector<float> c(static_cast<std::size_t>(s.m * s.n), -123.0f);
            ops::gemm::Problem p;
            p.m = s.m, p.n = s.n, p.k = s.k, p.a = a.data(), p.lda = s.k, p.b = b.data();
            p.ldb = trans_b ? s.k : s.n, p.trans_b = trans_b, p.c = c.data(), p.ldc = s.n;
            p.epilogue = {bias_p, act, res_p, s.n, gate_p};
            ops::gemm::sgemm(p, isa, threads);
            const auto want = expected(s, a, b, trans_b, bias_p, act, res_p, gate_p);
            // f32 accumulation of K products of size <= 1, plus the fast tanh/exp (< 1e-6).
            const double tolerance = 2e-6 * static_cast<double>(s.k) + 2e-6;
            for (std::size_t i = 0; i < want.size(); ++i)
              ASSERT_NEAR(c[i], want[i], tolerance)
                  << ops::gemm::isa_name(isa) << " M,N,K=" << s.m << "," << s.n << "," << s.k << " trans_b=" << trans_b
                  << " threads=" << threads << " variant=" << variant << " at " << i;
          }
        }
  }
}

TEST(Gemm, EveryBackendThroughTheDevice) {
  const Case s{37, 45, 70};
  const auto a = random_values(s.m * s.k, 6), w = random_values(s.n * s.k, 7), bias = random_values(s.n, 8);
  const auto residual = random_values(s.m * s.n, 9), gate = random_values(s.n, 10);
  const Tensor ta = Tensor::from_vector(a, {s.m, s.k}), tw = Tensor::from_vector(w, {s.n, s.k});
  const Tensor tbias = Tensor::from_vector(bias, {s.n}), tres = Tensor::from_vector(residual, {s.m, s.n});
  const Tensor tgate = Tensor::from_vector(gate, {s.n});
  const auto want = expected(s, a, w, true, bias.data(), Activation::silu, residual.data(), gate.data());
  for (auto backend : {ops::GemmBackend::cubevec, ops::GemmBackend::openblas, ops::GemmBackend::eigen, ops::GemmBackend::reference}) {
    const Tensor c = ops::matmul(
        ta, tw, {.bias = tbias, .activation = Activation::silu, .residual = tres, .gate = tgate, .b_is_weight = true, .backend = backend});
    ASSERT_EQ(c.shape(), (Shape{s.m, s.n}));
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(c.data<float>()[i], want[i], 2e-4) << ops::gemm_backend_name(backend) << " at " << i;
  }
}

// The low-rank update (a runtime LoRA's): C = residual + gate act(A W^T + bias + L R), on every
// backend and the bf16 kernels, batched too, against a double loop. n = 45 leaves a tail of the
// 16-column blocks, m = 37 a tail of the 4-row blocks.
TEST(Gemm, LowRankUpdateBeforeTheActivation) {
  const int64_t m = 37, n = 45, k = 70, rank = 3, batches = 2;
  const auto a = random_values(batches * m * k, 21), w = random_values(n * k, 22), bias = random_values(n, 23);
  const auto left = random_values(batches * m * rank, 24), right = random_values(rank * n, 25);
  const auto residual = random_values(batches * m * n, 26), gate = random_values(n, 27);
  std::vector<double> want(static_cast<std::size_t>(batches * m * n));
  for (int64_t i = 0; i < batches * m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double x = bias[j];
      for (int64_t q = 0; q < k; ++q) x += static_cast<double>(a[i * k + q]) * w[j * k + q];
      for (int64_t q = 0; q < rank; ++q) x += static_cast<double>(left[i * rank + q]) * right[q * n + j];
      x = x / (1.0 + std::exp(-x));
      want[static_cast<std::size_t>(i * n + j)] = residual[i * n + j] + gate[j] * x;
    }
  ops::MatmulOptions o{.bias = Tensor::from_vector(bias, {n}),
                       .low_rank_a = Tensor::from_vector(left, {batches * m, rank}),
                       .low_rank_b = Tensor::from_vector(right, {rank, n}),
                       .activation = Activation::silu,
                       .residual = Tensor::from_vector(residual, {batches * m, n}),
                       .gate = Tensor::from_vector(gate, {n}),
                       .b_is_weight = true};
  const Tensor ta = Tensor::from_vector(a, {batches * m, k}), tw = Tensor::from_vector(w, {n, k});
  for (auto backend : {ops::GemmBackend::cubevec, ops::GemmBackend::openblas, ops::GemmBackend::eigen, ops::GemmBackend::reference}) {
    o.backend = backend;
    const Tensor c = ops::matmul(ta, tw, o);
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(c.data<float>()[i], want[i], 2e-4) << ops::gemm_backend_name(backend) << " at " << i;
  }
  // bf16 inputs (the bf16 / AMX kernels' epilogue): within bf16 rounding of the inputs.
  o.backend = ops::GemmBackend::cubevec;
  o.compute = DType::bf16;
  const Tensor c16 = ops::matmul(ops::cast(ta, DType::bf16), ops::cast(tw, DType::bf16), o);
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(c16.data<float>()[i], want[i], 0.05 * (1 + std::fabs(want[i]))) << "bf16 at " << i;
  // Batched: each batch's rows take their own rows of low_rank_a.
  o.compute = DType::f32;
  o.low_rank_a = Tensor::from_vector(left, {batches, m, rank});
  o.residual = Tensor::from_vector(residual, {batches, m, n});
  const Tensor cb = ops::bmm(ta.reshape({batches, m, k}), tw.transpose(0, 1).contiguous(),
                             {.bias = o.bias,
                              .low_rank_a = o.low_rank_a,
                              .low_rank_b = o.low_rank_b,
                              .activation = Activation::silu,
                              .residual = o.residual,
                              .gate = o.gate});
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(cb.data<float>()[i], want[i], 2e-4) << "bmm at " << i;
  // Shapes that do not fit are errors naming the update.
  o.low_rank_a = Tensor::from_vector(left, {batches * m, rank});
  o.residual = Tensor::from_vector(residual, {batches * m, n});
  o.low_rank_b = Tensor::from_vector(random_values(rank * 4, 28), {rank, 4});
  EXPECT_NE(message_of([&] { ops::matmul(ta, tw, o); }).find("a low-rank update needs"), std::string::npos);
}

TEST(Gemm, LinearKeepsLeadingDimensions) {
  const auto x = random_values(2 * 3 * 8, 11), w = random_values(5 * 8, 12);
  const Tensor y = ops::linear(Tensor::from_vector(x, {2, 3, 8}), Tensor::from_vector(w, {5, 8}));
  ASSERT_EQ(y.shape(), (Shape{2, 3, 5}));
  const auto want = expected({6, 5, 8}, x, w, true, nullptr, Activation::none, nullptr, nullptr);
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(y.data<float>()[i], want[i], 1e-5);
}

TEST(Gemm, RejectsBadShapesAndLayouts) {
  const Tensor a = Tensor::from_vector(random_values(12, 1), {4, 3}), b = Tensor::from_vector(random_values(10, 2), {5, 2});
  EXPECT_NE(message_of([&] { ops::matmul(a, b); }).find("expected A [M, K] and B [K, N], got A [4, 3] and B [5, 2]"), std::string::npos);
  EXPECT_NE(message_of([&] { ops::matmul(a, b, {.b_is_weight = true}); }).find("a weight [N, K]"), std::string::npos);
  const Tensor bt = Tensor::from_vector(random_values(6, 3), {2, 3}).transpose(0, 1);
  EXPECT_NE(message_of([&] { ops::matmul(a, bt); }).find("B must be a contiguous f32 or bf16 tensor"), std::string::npos);
  const Tensor b32 = Tensor::from_vector(random_values(6, 4), {3, 2});
  EXPECT_NE(message_of([&] {
              ops::matmul(a, b32, {.bias = Tensor::from_vector(random_values(3, 5), {3})});
            }).find("bias must have shape [2], got [3]"),
            std::string::npos);
  EXPECT_NE(
      message_of([&] { ops::matmul(a, b32, {.gate = Tensor::from_vector(random_values(2, 5), {2})}); }).find("a gate needs a residual"),
      std::string::npos);
  EXPECT_NE(message_of([&] {
              ops::matmul(a, b32, {.residual = Tensor::from_vector(random_values(8, 6), {2, 4})});
            }).find("residual must have shape [4, 2]"),
            std::string::npos);
  EXPECT_NE(message_of([] { ops::parse_gemm_backend("mkl"); }).find("expected one of: cubevec, openblas, eigen, reference"),
            std::string::npos);
}

}  // namespace gemm_test
}  // namespace cubevec
