#include "ops/gemm.h"

#include <cblas.h>

#include <Eigen/Core>
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

gemm::EpilogueFn best_epilogue() {
  switch (gemm::best_isa()) {
    case gemm::Isa::avx512: return gemm::epilogue_avx512;
    case gemm::Isa::avx2: return gemm::epilogue_avx2;
    case gemm::Isa::portable: return gemm::epilogue_portable;
  }
  return gemm::epilogue_portable;
}

// Rows of C split over the unit's threads; `rows_fn(row0, rows)` computes the plain product.
template <class RowsFn>
void split_rows(int64_t m, RowsFn rows_fn) {
  const int64_t block = std::max<int64_t>(16, (m + 15) / 16);
  tbb::parallel_for(int64_t{0}, (m + block - 1) / block, [&](int64_t i) {
    const int64_t row = i * block;
    rows_fn(row, std::min(block, m - row));
  });
}

void gemm_openblas(const gemm::Problem& p) {
  split_rows(p.m, [&](int64_t row, int64_t rows) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, p.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(rows),
                static_cast<int>(p.n), static_cast<int>(p.k), 1.0f, p.a + row * p.lda, static_cast<int>(p.lda), p.b,
                static_cast<int>(p.ldb), 0.0f, p.c + row * p.ldc, static_cast<int>(p.ldc));
  });
}

void gemm_eigen(const gemm::Problem& p) {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Stride = Eigen::OuterStride<>;
  split_rows(p.m, [&](int64_t row, int64_t rows) {
    Eigen::Map<const Matrix, 0, Stride> a(p.a + row * p.lda, rows, p.k, Stride(p.lda));
    Eigen::Map<Matrix, 0, Stride> c(p.c + row * p.ldc, rows, p.n, Stride(p.ldc));
    if (p.trans_b) c.noalias() = a * Eigen::Map<const Matrix, 0, Stride>(p.b, p.n, p.k, Stride(p.ldb)).transpose();
    else c.noalias() = a * Eigen::Map<const Matrix, 0, Stride>(p.b, p.k, p.n, Stride(p.ldb));
  });
}

void check_vector(const Tensor& t, int64_t n, const char* what) {
  require_contiguous_f32(t, "matmul", what);
  if (t.shape() != Shape{n})
    throw Error(std::string("matmul: ") + what + " must have shape [" + std::to_string(n) + "], got " +
                shape_to_string(t.shape()));
}

}  // namespace

GemmBackend parse_gemm_backend(std::string_view name) {
  for (GemmBackend b : {GemmBackend::cubevec, GemmBackend::openblas, GemmBackend::eigen, GemmBackend::reference})
    if (gemm_backend_name(b) == name) return b;
  throw Error("unknown GEMM backend '" + std::string(name) + "' (expected one of: cubevec, openblas, eigen, reference)");
}

std::string_view gemm_backend_name(GemmBackend backend) {
  switch (backend) {
    case GemmBackend::cubevec: return "cubevec";
    case GemmBackend::openblas: return "openblas";
    case GemmBackend::eigen: return "eigen";
    case GemmBackend::reference: return "reference";
  }
  return "?";
}

void gemm_reference(const gemm::Problem& p) {
  const gemm::Epilogue& ep = p.epilogue;
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      double sum = ep.bias ? ep.bias[j] : 0.0;
      for (int64_t q = 0; q < p.k; ++q)
        sum += static_cast<double>(p.a[i * p.lda + q]) * (p.trans_b ? p.b[j * p.ldb + q] : p.b[q * p.ldb + j]);
      if (ep.activation == gemm::Activation::gelu_tanh)
        sum = 0.5 * sum * (1.0 + std::tanh(0.7978845608028654 * (sum + 0.044715 * sum * sum * sum)));
      else if (ep.activation == gemm::Activation::silu)
        sum = sum / (1.0 + std::exp(-sum));
      if (ep.residual) sum = ep.residual[i * ep.ld_residual + j] + (ep.gate ? ep.gate[j] : 1.0) * sum;
      p.c[i * p.ldc + j] = static_cast<float>(sum);
    }
}

Tensor matmul(const Tensor& a, const Tensor& b, const MatmulOptions& o, const Stream& stream) {
  require_contiguous_f32(a, "matmul", "A");
  require_contiguous_f32(b, "matmul", "B");
  const int64_t k_of_b = b.dim() == 2 ? (o.b_is_weight ? b.size(1) : b.size(0)) : -1;
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != k_of_b)
    throw Error(std::string("matmul: expected A [M, K] and ") + (o.b_is_weight ? "a weight [N, K]" : "B [K, N]") +
                ", got A " + shape_to_string(a.shape()) + " and " + (o.b_is_weight ? "weight " : "B ") +
                shape_to_string(b.shape()));
  const int64_t m = a.size(0), k = a.size(1), n = o.b_is_weight ? b.size(0) : b.size(1);
  std::vector<Tensor> reads = {a, b};
  if (o.bias.defined()) {
    check_vector(o.bias, n, "bias");
    reads.push_back(o.bias);
  }
  if (o.gate.defined()) {
    if (!o.residual.defined()) throw Error("matmul: a gate needs a residual to add the gated result to");
    check_vector(o.gate, n, "gate");
    reads.push_back(o.gate);
  }
  if (o.residual.defined()) {
    require_contiguous_f32(o.residual, "matmul", "residual");
    if (o.residual.shape() != Shape{m, n})
      throw Error("matmul: residual must have shape " + shape_to_string(Shape{m, n}) + ", got " +
                  shape_to_string(o.residual.shape()));
    reads.push_back(o.residual);
  }
  Tensor c = stream.device().empty({m, n}, DType::f32, stream);
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const double bytes = 4.0 * static_cast<double>(m * k + k * n + m * n * (o.residual.defined() ? 2 : 1));
  if (o.backend == GemmBackend::openblas) make_openblas_single_threaded();
  const std::string name = "matmul_" + std::string(gemm_backend_name(o.backend));
  stream.launch({name, Unit::cube, flops, bytes, DType::f32}, reads, {c}, [a, b, c, o, m, n, k] {
    const auto ptr = [](const Tensor& t) {
      return t.defined() ? reinterpret_cast<const float*>(t.unsynchronized_data_ptr()) : nullptr;
    };
    gemm::Problem p;
    p.m = m, p.n = n, p.k = k;
    p.a = ptr(a), p.lda = k;
    p.b = ptr(b), p.ldb = o.b_is_weight ? k : n, p.trans_b = o.b_is_weight;
    p.c = reinterpret_cast<float*>(c.unsynchronized_data_ptr()), p.ldc = n;
    p.epilogue = {ptr(o.bias), o.activation, ptr(o.residual), n, ptr(o.gate)};
    switch (o.backend) {
      case GemmBackend::cubevec: return gemm::sgemm(p, gemm::best_isa(), tbb::this_task_arena::max_concurrency());
      case GemmBackend::reference: return gemm_reference(p);
      case GemmBackend::openblas: gemm_openblas(p); break;
      case GemmBackend::eigen: gemm_eigen(p); break;
    }
    if (!p.epilogue.empty()) {  // the library backends have no fused epilogue: apply it after
      const gemm::EpilogueFn epilogue = best_epilogue();
      split_rows(m, [&](int64_t row, int64_t rows) { epilogue(p.epilogue, p.c + row * n, n, row, 0, rows, n); });
    }
  });
  return c;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Stream& stream) {
  if (x.dim() < 1) throw Error("linear: x must have at least one dimension, got a scalar");
  const int64_t k = x.size(-1);
  Shape out_shape = x.shape();
  const Tensor y = matmul(x.view({-1, k}), weight, {.bias = bias, .b_is_weight = true}, stream);
  out_shape.back() = y.size(1);
  return y.view(out_shape);
}

}  // namespace cubevec::ops
