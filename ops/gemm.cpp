#include "ops/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <tbb/parallel_for.h>

namespace cubevec::ops {

namespace {

// cubevec threads its own kernels; OpenBLAS must not start a second thread pool inside them.
void make_openblas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

void gemm_openblas(const float* a, const float* b, const float* bias, float* c, int64_t m, int64_t n, int64_t k) {
  // Row blocks over the unit's threads; each block is one single-threaded sgemm.
  const int64_t block = std::max<int64_t>(16, (m + 15) / 16);
  tbb::parallel_for(int64_t{0}, (m + block - 1) / block, [&](int64_t i) {
    const int64_t row = i * block, rows = std::min(block, m - row);
    float beta = 0.0f;
    if (bias) {
      for (int64_t r = 0; r < rows; ++r) std::copy(bias, bias + n, c + (row + r) * n);
      beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(n),
                static_cast<int>(k), 1.0f, a + row * k, static_cast<int>(k), b, static_cast<int>(n), beta, c + row * n,
                static_cast<int>(n));
  });
}

}  // namespace

GemmBackend parse_gemm_backend(std::string_view name) {
  if (name == "openblas") return GemmBackend::openblas;
  if (name == "reference") return GemmBackend::reference;
  throw Error("unknown GEMM backend '" + std::string(name) + "' (expected one of: openblas, reference)");
}

void gemm_reference(const float* a, const float* b, const float* bias, float* c, int64_t m, int64_t n, int64_t k) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = bias ? bias[j] : 0.0;
      for (int64_t p = 0; p < k; ++p) sum += static_cast<double>(a[i * k + p]) * b[p * n + j];
      c[i * n + j] = static_cast<float>(sum);
    }
}

Tensor matmul(const Tensor& a, const Tensor& b, const Tensor& bias, GemmBackend backend, const Stream& stream) {
  require_contiguous_f32(a, "matmul", "A");
  require_contiguous_f32(b, "matmul", "B");
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0))
    throw Error("matmul: expected A [M, K] and B [K, N], got A " + shape_to_string(a.shape()) + " and B " +
                shape_to_string(b.shape()));
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (bias.defined()) {
    require_contiguous_f32(bias, "matmul", "bias");
    if (bias.shape() != Shape{n})
      throw Error("matmul: bias must have shape [" + std::to_string(n) + "], got " + shape_to_string(bias.shape()));
  }
  Tensor c = stream.device().empty({m, n}, DType::f32, stream);
  std::vector<Tensor> reads = {a, b};
  if (bias.defined()) reads.push_back(bias);
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const double bytes = 4.0 * static_cast<double>(m * k + k * n + m * n + (bias.defined() ? n : 0));
  const char* name = backend == GemmBackend::openblas ? "matmul_openblas" : "matmul_reference";
  if (backend == GemmBackend::openblas) make_openblas_single_threaded();
  stream.launch({name, Unit::cube, flops, bytes, DType::f32}, reads, {c}, [a, b, bias, c, m, n, k, backend] {
    const auto* pa = reinterpret_cast<const float*>(a.unsynchronized_data_ptr());
    const auto* pb = reinterpret_cast<const float*>(b.unsynchronized_data_ptr());
    const auto* pbias = bias.defined() ? reinterpret_cast<const float*>(bias.unsynchronized_data_ptr()) : nullptr;
    auto* pc = reinterpret_cast<float*>(c.unsynchronized_data_ptr());
    if (backend == GemmBackend::openblas) gemm_openblas(pa, pb, pbias, pc, m, n, k);
    else gemm_reference(pa, pb, pbias, pc, m, n, k);
  });
  return c;
}

}  // namespace cubevec::ops
