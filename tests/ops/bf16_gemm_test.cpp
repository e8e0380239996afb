// bf16 GEMM (AVX512-BF16 dot products where the CPU has them, the f32 kernel on rounded inputs
// elsewhere) and batched GEMM, against a double-precision loop on the bf16-rounded inputs.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <random>

#include "ops/gemm.h"
#include "ops/gemm/driver.h"
#include "tensor/half.h"

#include "common/amx_model_scope.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace bf16_gemm_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

Tensor as_bf16(const std::vector<float>& v, const Shape& shape) {
  Tensor t = Tensor::empty(shape, DType::bf16);
  auto* p = t.mutable_data<uint16_t>();
  for (std::size_t i = 0; i < v.size(); ++i) p[i] = f32_to_bf16(v[i]);
  return t;
}

// C = round(A) x round(B) in double; B is [K, N] or, with trans_b, [N, K].
std::vector<double> product(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t n, int64_t k, bool trans_b) {
  std::vector<double> c(static_cast<std::size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t q = 0; q < k; ++q) s += double(round_bf16(a[i * k + q])) * round_bf16(trans_b ? b[j * k + q] : b[q * n + j]);
      c[static_cast<std::size_t>(i * n + j)] = s;
    }
  return c;
}

TEST(Bf16Gemm, MatchesTheLoopOnRoundedInputs) {
  const int64_t sizes[][3] = {{1, 1, 1}, {7, 17, 5}, {17, 33, 129}, {29, 65, 300}, {130, 70, 1601}};
  for (const auto& s : sizes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    const auto a = random_values(m * k, 1), b = random_values(k * n, 2);
    for (bool trans_b : {false, true}) {
      const auto want = product(a, b, m, n, k, trans_b);
      const Shape b_shape = trans_b ? Shape{n, k} : Shape{k, n};
      // bf16 tensors in, and f32 tensors computed in bf16: both round the same way.
      for (bool bf16_tensors : {true, false}) {
        const Tensor ta = bf16_tensors ? as_bf16(a, {m, k}) : Tensor::from_vector(a, {m, k});
        const Tensor tb = bf16_tensors ? as_bf16(b, b_shape) : Tensor::from_vector(b, b_shape);
        for (auto backend : {ops::GemmBackend::cubevec, ops::GemmBackend::reference}) {
          const Tensor c = ops::matmul(ta, tb, {.b_is_weight = trans_b, .compute = DType::bf16, .backend = backend});
          ASSERT_EQ(c.dtype(), DType::f32);
          // Exact products of bf16 values, summed in f32 (pairwise in the dot instruction).
          const double tolerance = 2e-6 * static_cast<double>(k) + 1e-6;
          for (std::size_t i = 0; i < want.size(); ++i)
            ASSERT_NEAR(c.data<float>()[i], want[i], tolerance)
                << "M,N,K=" << m << "," << n << "," << k << " trans_b=" << trans_b << " bf16 tensors=" << bf16_tensors << " "
                << ops::gemm_backend_name(backend) << " at " << i;
        }
      }
    }
  }
}

TEST(Bf16Gemm, EveryIsaComputesTheSameRoundedProduct) {
  // Without AVX512-BF16 (here: forcing the AVX2 or portable kernel) bf16 compute rounds the inputs
  // and runs the f32 kernel; the results must agree with the dot-product path.
  const int64_t m = 23, n = 37, k = 301;
  const auto a = random_values(m * k, 11), b = random_values(k * n, 12);
  const auto want = product(a, b, m, n, k, false);
  for (auto isa : {ops::gemm::Isa::avx512, ops::gemm::Isa::avx2, ops::gemm::Isa::portable}) {
    if (!ops::gemm::isa_supported(isa)) continue;
    std::vector<float> c(static_cast<std::size_t>(m * n));
    ops::gemm::Problem p;
    p.m = m, p.n = n, p.k = k, p.a = a.data(), p.lda = k, p.b = b.data(), p.ldb = n, p.c = c.data(), p.ldc = n;
    p.compute = ops::gemm::Element::bf16;
    ops::gemm::sgemm(p, isa, 2);
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(c[i], want[i], 1e-3) << ops::gemm::isa_name(isa) << " at " << i;
  }
}

TEST(Bf16Gemm, EveryVariantTheCalibrationWeighsMatchesTheLoopPackedOrNot) {
  const cubevec::testing::AmxModelWhereNoAmx amx_tiles;  // AMX on the tile model where the CPU has none
  // AMX tiles (32 x 32 blocks, k padded to 32), AVX512-BF16 dot products and the f32 kernel on
  // rounded values, each at every L2 share the calibration measures, on this machine's caches and
  // on a small fake L2 (so MC is one register panel and the row blocks have edges): shapes with
  // edge tiles, a K past one K block (1536) and not a multiple of 32, B packed per call and packed
  // once. Kernels the CPU lacks are skipped (and say so).
  if (!ops::gemm::isa_supported(ops::gemm::Isa::avx512)) GTEST_SKIP() << "no AVX-512: the bf16 kernels are not used";
  for (auto path : {ops::gemm::Bf16Path::amx, ops::gemm::Bf16Path::dot})
    if (!ops::gemm::bf16_path_available(path))
      std::printf("bf16 path %s: not on this CPU, skipped\n", std::string(ops::gemm::bf16_path_name(path)).c_str());
  ops::gemm::CpuCaches tiny;
  tiny.l2 = 96 << 10;
  const int64_t sizes[][3] = {{1, 1, 1}, {32, 32, 32}, {33, 65, 47}, {70, 100, 1601}};
  std::vector<ops::gemm::GemmVariant> variants;
  for (auto path : {ops::gemm::Bf16Path::amx, ops::gemm::Bf16Path::dot, ops::gemm::Bf16Path::f32})
    if (ops::gemm::bf16_path_available(path))
      for (int share : {2, 4, 8}) variants.push_back({path, share});
  for (const auto& variant : variants)
    for (const auto& caches : {ops::gemm::this_cpu_caches(), tiny})
      for (const auto& s : sizes) {
        const int64_t m = s[0], n = s[1], k = s[2];
        const auto a = random_values(m * k, 21), b = random_values(k * n, 22);
        const auto want = product(a, b, m, n, k, true);
        std::vector<uint16_t> a16(a.size()), b16(b.size());
        for (std::size_t i = 0; i < a.size(); ++i) a16[i] = f32_to_bf16(a[i]);
        for (std::size_t i = 0; i < b.size(); ++i) b16[i] = f32_to_bf16(b[i]);
        for (bool packed : {false, true}) {
          std::vector<float> c(static_cast<std::size_t>(m * n), -7.0f);
          ops::gemm::Problem p;
          p.m = m, p.n = n, p.k = k, p.a = a16.data(), p.lda = k, p.a_type = ops::gemm::Element::bf16;
          p.b = b16.data(), p.ldb = k, p.b_type = ops::gemm::Element::bf16, p.trans_b = true;
          p.c = c.data(), p.ldc = n, p.compute = ops::gemm::Element::bf16;
          std::shared_ptr<const ops::gemm::PackedB> panels;
          if (packed) {
            panels = ops::gemm::pack_b_once_for(p, ops::gemm::Isa::avx512, variant.bf16);
            p.packed_b = panels.get();
          }
          ops::gemm::sgemm_variant(p, ops::gemm::Isa::avx512, 2, variant, caches);
          const double tolerance = 2e-6 * static_cast<double>(k) + 1e-6;
          for (std::size_t i = 0; i < want.size(); ++i)
            ASSERT_NEAR(c[i], want[i], tolerance) << variant.name() << " on " << caches.text() << " M,N,K=" << m << "," << n << "," << k
                                                  << (packed ? " packed" : "") << " at " << i;
        }
      }
}

TEST(Bf16Gemm, LibraryBackendsRefuseBf16Inputs) {
  const Tensor a = as_bf16(random_values(6, 3), {2, 3}), b = as_bf16(random_values(6, 4), {3, 2});
  try {
    ops::matmul(a, b, {.backend = ops::GemmBackend::openblas});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the openblas backend takes f32 inputs only"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::matmul(Tensor::from_vector(random_values(6, 5), {2, 3}), Tensor::from_vector(random_values(6, 6), {3, 2}),
                           {.compute = DType::i8}),
               Error);
}

TEST(BatchedGemm, EveryBatchMatchesItsOwnProduct) {
  for (int64_t batches : {1, 2, 5}) {
    const int64_t m = 9, n = 13, k = 21;
    const auto a = random_values(batches * m * k, 7), b = random_values(batches * k * n, 8);
    const auto shared = random_values(k * n, 9), bias = random_values(n, 10);
    const Tensor c = ops::bmm(Tensor::from_vector(a, {batches, m, k}), Tensor::from_vector(b, {batches, k, n}),
                              {.bias = Tensor::from_vector(bias, {n})});
    const Tensor c_shared = ops::bmm(Tensor::from_vector(a, {batches, m, k}), Tensor::from_vector(shared, {k, n}));
    ASSERT_EQ(c.shape(), (Shape{batches, m, n}));
    for (int64_t t = 0; t < batches; ++t)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = bias[j], s_shared = 0;
          for (int64_t q = 0; q < k; ++q) {
            s += double(a[(t * m + i) * k + q]) * b[(t * k + q) * n + j];
            s_shared += double(a[(t * m + i) * k + q]) * shared[q * n + j];
          }
          ASSERT_NEAR(c.at<float>({t, i, j}), s, 1e-4) << t << "," << i << "," << j;
          ASSERT_NEAR(c_shared.at<float>({t, i, j}), s_shared, 1e-4) << t << "," << i << "," << j;
        }
  }
  EXPECT_THROW(ops::bmm(Tensor::from_vector(random_values(12, 1), {2, 2, 3}), Tensor::from_vector(random_values(18, 2), {3, 3, 2})), Error);
}

}  // namespace bf16_gemm_test
}  // namespace cubevec
