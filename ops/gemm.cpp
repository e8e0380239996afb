#include "ops/gemm.h"

#include <cblas.h>

#include <Eigen/Core>
#include <algorithm>
#include <mutex>
#include <tbb/parallel_for.h>

#include "base/enum_names.h"
#include "tensor/half.h"

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
    cblas_sgemm(CblasRowMajor, CblasNoTrans, p.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(rows), static_cast<int>(p.n),
                static_cast<int>(p.k), 1.0f, static_cast<const float*>(p.a) + row * p.lda, static_cast<int>(p.lda),
                static_cast<const float*>(p.b), static_cast<int>(p.ldb), 0.0f, p.c + row * p.ldc, static_cast<int>(p.ldc));
  });
}

void gemm_eigen(const gemm::Problem& p) {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Stride = Eigen::OuterStride<>;
  split_rows(p.m, [&](int64_t row, int64_t rows) {
    const auto* pa = static_cast<const float*>(p.a);
    const auto* pb = static_cast<const float*>(p.b);
    Eigen::Map<const Matrix, 0, Stride> a(pa + row * p.lda, rows, p.k, Stride(p.lda));
    Eigen::Map<Matrix, 0, Stride> c(p.c + row * p.ldc, rows, p.n, Stride(p.ldc));
    if (p.trans_b) c.noalias() = a * Eigen::Map<const Matrix, 0, Stride>(pb, p.n, p.k, Stride(p.ldb)).transpose();
    else c.noalias() = a * Eigen::Map<const Matrix, 0, Stride>(pb, p.k, p.n, Stride(p.ldb));
  });
}

void check_vector(const Tensor& t, int64_t n, const char* what) {
  require_contiguous_f32(t, "matmul", what);
  if (t.shape() != Shape{n})
    throw Error(std::string("matmul: ") + what + " must have shape [" + std::to_string(n) + "], got " + shape_to_string(t.shape()));
}

}  // namespace

namespace {
constexpr auto kBackendNames = enum_names<GemmBackend>("GEMM backend", {{GemmBackend::cubevec, "cubevec"},
                                                                        {GemmBackend::openblas, "openblas"},
                                                                        {GemmBackend::eigen, "eigen"},
                                                                        {GemmBackend::reference, "reference"}});
}  // namespace

GemmBackend parse_gemm_backend(std::string_view name) { return kBackendNames.parse(name); }

std::string_view gemm_backend_name(GemmBackend backend) { return kBackendNames.name(backend); }

void gemm_reference(const gemm::Problem& p) {
  const gemm::Epilogue& ep = p.epilogue;
  // An input element as the computation sees it: bf16 inputs exactly, f32 inputs rounded to bf16
  // when computing in bf16.
  const auto element = [&](const void* base, gemm::Element type, int64_t index) -> double {
    if (type == gemm::Element::bf16) return bf16_to_f32(static_cast<const uint16_t*>(base)[index]);
    if (type == gemm::Element::i8) {  // a weight [N, K]: the column is index / ldb
      const float v = static_cast<float>(static_cast<const int8_t*>(base)[index]) * p.b_scale[index / p.ldb];
      return p.compute == gemm::Element::bf16 ? bf16_to_f32(f32_to_bf16(v)) : v;
    }
    const float v = static_cast<const float*>(base)[index];
    return p.compute == gemm::Element::bf16 ? bf16_to_f32(f32_to_bf16(v)) : v;
  };
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      double sum = ep.bias ? ep.bias[j] : 0.0;
      for (int64_t q = 0; q < p.k; ++q)
        sum += element(p.a, p.a_type, i * p.lda + q) * element(p.b, p.b_type, p.trans_b ? j * p.ldb + q : q * p.ldb + j);
      for (int64_t q = 0; ep.low_rank_a && q < ep.low_rank; ++q)
        sum += static_cast<double>(ep.low_rank_a[i * ep.ld_low_rank_a + q]) * ep.low_rank_b[q * ep.ld_low_rank_b + j];
      if (ep.activation == gemm::Activation::gelu_tanh)
        sum = 0.5 * sum * (1.0 + std::tanh(0.7978845608028654 * (sum + 0.044715 * sum * sum * sum)));
      else if (ep.activation == gemm::Activation::silu) sum = sum / (1.0 + std::exp(-sum));
      if (ep.residual) {
        const int64_t r = i * ep.ld_residual + j;
        const double res =
            ep.residual_bf16 ? bf16_to_f32(static_cast<const uint16_t*>(ep.residual)[r]) : static_cast<const float*>(ep.residual)[r];
        sum = res + (ep.gate ? ep.gate[j] : 1.0) * sum;
      }
      p.c[i * p.ldc + j] = static_cast<float>(sum);
      if (ep.out_bf16) ep.out_bf16[i * ep.ld_out + j] = f32_to_bf16(static_cast<float>(sum));
    }
}

namespace {

void require_matrix_operand(const Tensor& t, const char* op, const char* what, GemmBackend backend) {
  if (!t.defined()) throw Error(std::string(op) + ": " + what + " is undefined");
  if (!t.is_contiguous() || (t.dtype() != DType::f32 && t.dtype() != DType::bf16))
    throw Error(std::string(op) + ": " + what + " must be a contiguous f32 or bf16 tensor, got " + t.describe());
  if (t.dtype() == DType::bf16 && backend != GemmBackend::cubevec && backend != GemmBackend::reference)
    throw Error(std::string(op) + ": the " + std::string(gemm_backend_name(backend)) + " backend takes f32 inputs only; " + what +
                " is bf16 (use the cubevec or reference backend)");
}

gemm::Element element_of(const Tensor& t) {
  return t.dtype() == DType::bf16 ? gemm::Element::bf16 : t.dtype() == DType::i8 ? gemm::Element::i8 : gemm::Element::f32;
}

// Checks the epilogue tensors against C [rows, n] and returns them as extra reads.
std::vector<Tensor> epilogue_reads(const MatmulOptions& o, const Shape& c_shape, int64_t n, const char* op) {
  std::vector<Tensor> reads;
  if (o.compute != DType::f32 && o.compute != DType::bf16)
    throw Error(std::string(op) + ": compute dtype must be f32 or bf16, got " + std::string(dtype_name(o.compute)));
  if (o.bias.defined()) {
    check_vector(o.bias, n, "bias");
    reads.push_back(o.bias);
  }
  if (o.gate.defined()) {
    if (!o.residual.defined()) throw Error(std::string(op) + ": a gate needs a residual to add the gated result to");
    check_vector(o.gate, n, "gate");
    reads.push_back(o.gate);
  }
  if (o.out != DType::f32 && o.out != DType::bf16)
    throw Error(std::string(op) + ": the output dtype must be f32 or bf16, got " + std::string(dtype_name(o.out)));
  if (o.residual.defined()) {
    if (!o.residual.is_contiguous() || (o.residual.dtype() != DType::f32 && o.residual.dtype() != DType::bf16))
      throw Error(std::string(op) + ": residual must be a contiguous f32 or bf16 tensor, got " + o.residual.describe());
    if (o.residual.shape() != c_shape)
      throw Error(std::string(op) + ": residual must have shape " + shape_to_string(c_shape) + ", got " +
                  shape_to_string(o.residual.shape()));
    reads.push_back(o.residual);
  }
  if (o.low_rank_a.defined() || o.low_rank_b.defined()) {
    const int64_t rows = c_shape.size() >= 2 ? c_shape[c_shape.size() - 2] : 1;
    const int64_t batches = o.low_rank_a.defined() ? o.low_rank_a.numel() / std::max<int64_t>(1, rows * o.low_rank_a.size(-1)) : 0;
    const bool ok = o.low_rank_a.defined() && o.low_rank_b.defined() && o.low_rank_a.is_contiguous() && o.low_rank_b.is_contiguous() &&
                    o.low_rank_a.dtype() == DType::f32 && o.low_rank_b.dtype() == DType::f32 && o.low_rank_b.dim() == 2 &&
                    o.low_rank_a.size(-1) == o.low_rank_b.size(0) && o.low_rank_b.size(1) == n && o.low_rank_a.size(-1) >= 1 &&
                    o.low_rank_a.numel() == batches * rows * o.low_rank_a.size(-1) && batches * rows * n == shape_numel(c_shape);
    if (!ok)
      throw Error(std::string(op) + ": a low-rank update needs contiguous f32 low_rank_a [rows of C, R] and low_rank_b [R, " +
                  std::to_string(n) + "], got " + (o.low_rank_a.defined() ? o.low_rank_a.describe() : std::string("none")) + " and " +
                  (o.low_rank_b.defined() ? o.low_rank_b.describe() : std::string("none")));
    reads.push_back(o.low_rank_a);
    reads.push_back(o.low_rank_b);
  }
  return reads;
}

// One GEMM on raw pointers with the chosen backend, epilogue included.
void run_gemm(gemm::Problem& p, GemmBackend backend, int threads) {
  switch (backend) {
    case GemmBackend::cubevec: return gemm::sgemm(p, gemm::best_isa(), threads);
    case GemmBackend::reference: return gemm_reference(p);
    case GemmBackend::openblas: gemm_openblas(p); break;
    case GemmBackend::eigen: gemm_eigen(p); break;
  }
  if (!p.epilogue.empty()) {  // the library backends have no fused epilogue: apply it after
    const gemm::EpilogueFn epilogue = best_epilogue();
    split_rows(p.m, [&](int64_t row, int64_t rows) { epilogue(p.epilogue, p.c + row * p.ldc, p.ldc, row, 0, rows, p.n); });
  }
}

const float* f32_ptr(const Tensor& t) { return t.defined() ? reinterpret_cast<const float*>(t.unsynchronized_data_ptr()) : nullptr; }

// The epilogue of one GEMM whose C (f32) starts at element `c_offset` of the call's result: the
// residual at the same offset; with a bf16 result, C is an f32 scratch and the values go to `out`.
gemm::Epilogue epilogue_of(const MatmulOptions& o, int64_t n, int64_t c_offset, const Tensor& out) {
  gemm::Epilogue ep;
  ep.bias = f32_ptr(o.bias);
  ep.activation = o.activation;
  if (o.residual.defined()) {
    ep.residual = o.residual.unsynchronized_data_ptr() + c_offset * static_cast<int64_t>(o.residual.itemsize());
    ep.residual_bf16 = o.residual.dtype() == DType::bf16;
    ep.ld_residual = n;
  }
  if (o.low_rank_a.defined()) {
    ep.low_rank = o.low_rank_b.size(0);
    ep.low_rank_a = f32_ptr(o.low_rank_a) + c_offset / n * ep.low_rank;
    ep.low_rank_b = f32_ptr(o.low_rank_b);
    ep.ld_low_rank_a = ep.low_rank;
    ep.ld_low_rank_b = n;
  }
  ep.gate = f32_ptr(o.gate);
  if (out.dtype() == DType::bf16) {
    ep.out_bf16 = reinterpret_cast<uint16_t*>(out.unsynchronized_data_ptr()) + c_offset;
    ep.ld_out = n;
  }
  return ep;
}

// Where C goes: the result itself (f32), or an f32 scratch from the caching allocator (bf16 result).
struct Accumulator {
  explicit Accumulator(const Tensor& out, int64_t elements)
      : scratch(out.dtype() == DType::f32 ? nullptr
                                          : static_cast<float*>(default_allocator().allocate(static_cast<std::size_t>(elements) * 4))),
        c(scratch ? scratch : reinterpret_cast<float*>(out.unsynchronized_data_ptr())) {}
  ~Accumulator() {
    if (scratch) default_allocator().deallocate(scratch);
  }
  Accumulator(const Accumulator&) = delete;
  Accumulator& operator=(const Accumulator&) = delete;
  float* scratch;
  float* c;
};

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, const MatmulOptions& o, const Stream& stream) {
  require_matrix_operand(a, "matmul", "A", o.backend);
  if (b.defined() && b.dtype() == DType::i8) {
    if (!o.b_is_weight || !b.is_contiguous() || b.dim() != 2 || (o.backend != GemmBackend::cubevec && o.backend != GemmBackend::reference))
      throw Error("matmul: an i8 B must be a contiguous weight [N, K] (b_is_weight) on the cubevec or reference backend, got " +
                  b.describe());
    if (!o.b_scale.defined()) throw Error("matmul: an i8 weight needs b_scale, its per-channel scale [N]");
    check_vector(o.b_scale, b.size(0), "b_scale");
  } else {
    require_matrix_operand(b, "matmul", "B", o.backend);
    if (o.b_scale.defined()) throw Error("matmul: b_scale applies to an i8 weight only, B is " + std::string(dtype_name(b.dtype())));
  }
  const int64_t k_of_b = b.dim() == 2 ? (o.b_is_weight ? b.size(1) : b.size(0)) : -1;
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != k_of_b)
    throw Error(std::string("matmul: expected A [M, K] and ") + (o.b_is_weight ? "a weight [N, K]" : "B [K, N]") + ", got A " +
                shape_to_string(a.shape()) + " and " + (o.b_is_weight ? "weight " : "B ") + shape_to_string(b.shape()));
  const int64_t m = a.size(0), k = a.size(1), n = o.b_is_weight ? b.size(0) : b.size(1);
  if (o.packed_weight && (o.backend != GemmBackend::cubevec || !o.b_is_weight || o.packed_weight->n != n || o.packed_weight->k != k ||
                          o.packed_weight->compute != (o.compute == DType::bf16 ? gemm::Element::bf16 : gemm::Element::f32)))
    throw Error("matmul: packed_weight was made for another weight, compute dtype or backend");
  std::vector<Tensor> reads = epilogue_reads(o, {m, n}, n, "matmul");
  reads.push_back(a);
  reads.push_back(b);
  if (o.b_scale.defined()) reads.push_back(o.b_scale);
  Tensor c = stream.device().empty({m, n}, o.out, stream);
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const double bytes = static_cast<double>(a.nbytes() + b.nbytes() + c.nbytes() + (o.residual.defined() ? o.residual.nbytes() : 0));
  if (o.backend == GemmBackend::openblas) make_openblas_single_threaded();
  const std::string name = "matmul_" + std::string(gemm_backend_name(o.backend)) + (o.compute == DType::bf16 ? "_bf16" : "") +
                           (b.dtype() == DType::i8 ? "_w8" : "");
  KernelDesc desc{name, Unit::cube, flops, bytes, o.compute};
  desc.cube_work = {1, m, n};
  stream.launch(desc, reads, {c}, [a, b, c, o, m, n, k] {
    gemm::Problem p;
    p.m = m, p.n = n, p.k = k;
    p.a = a.unsynchronized_data_ptr(), p.lda = k, p.a_type = element_of(a);
    p.b = b.unsynchronized_data_ptr(), p.ldb = o.b_is_weight ? k : n, p.b_type = element_of(b);
    p.b_scale = f32_ptr(o.b_scale);
    p.trans_b = o.b_is_weight;
    const Accumulator acc(c, m * n);
    p.c = acc.c, p.ldc = n;
    p.compute = o.compute == DType::bf16 ? gemm::Element::bf16 : gemm::Element::f32;
    p.epilogue = epilogue_of(o, n, 0, c);
    p.packed_b = o.packed_weight.get();
    run_gemm(p, o.backend, tbb::this_task_arena::max_concurrency());
  });
  return c;
}

std::shared_ptr<const gemm::PackedB> pack_weight(const Tensor& weight, DType compute, int threads) {
  if (!weight.defined() || weight.dim() != 2 || (weight.dtype() != DType::f32 && weight.dtype() != DType::bf16))
    throw Error("pack_weight: expected an f32 or bf16 weight [N, K], got " +
                (weight.defined() ? weight.describe() : std::string("undefined")));
  const Tensor w = weight.contiguous();
  gemm::Problem p;
  p.n = w.size(0);
  p.k = w.size(1);
  p.b = w.data_ptr();
  p.ldb = p.k;
  p.b_type = w.dtype() == DType::bf16 ? gemm::Element::bf16 : gemm::Element::f32;
  p.trans_b = true;
  p.compute = compute == DType::bf16 ? gemm::Element::bf16 : gemm::Element::f32;
  return gemm::pack_b_once(p, gemm::best_isa(), threads);
}

Tensor bmm(const Tensor& a, const Tensor& b, const MatmulOptions& o, const Stream& stream) {
  require_matrix_operand(a, "bmm", "A", o.backend);
  require_matrix_operand(b, "bmm", "B", o.backend);
  const bool shared_b = b.dim() == 2;
  const int64_t k_of_b = (b.dim() == 2 || b.dim() == 3) ? (o.b_is_weight ? b.size(-1) : b.size(-2)) : -1;
  if (a.dim() != 3 || !(shared_b || b.dim() == 3) || a.size(2) != k_of_b || (!shared_b && b.size(0) != a.size(0)))
    throw Error(std::string("bmm: expected A [Bt, M, K] and ") + (o.b_is_weight ? "a weight" : "B") +
                (o.b_is_weight ? " [Bt, N, K] or [N, K]" : " [Bt, K, N] or [K, N]") + ", got A " + shape_to_string(a.shape()) + " and " +
                shape_to_string(b.shape()));
  const int64_t batches = a.size(0), m = a.size(1), k = a.size(2), n = o.b_is_weight ? b.size(-2) : b.size(-1);
  std::vector<Tensor> reads = epilogue_reads(o, {batches, m, n}, n, "bmm");
  reads.push_back(a);
  reads.push_back(b);
  Tensor c = stream.device().empty({batches, m, n}, o.out, stream);
  const double flops = 2.0 * static_cast<double>(batches * m) * static_cast<double>(n) * static_cast<double>(k);
  const double bytes = static_cast<double>(a.nbytes() + b.nbytes() + c.nbytes());
  if (o.backend == GemmBackend::openblas) make_openblas_single_threaded();
  const std::string name = "bmm_" + std::string(gemm_backend_name(o.backend)) + (o.compute == DType::bf16 ? "_bf16" : "");
  KernelDesc desc{name, Unit::cube, flops, bytes, o.compute};
  desc.cube_work = {batches, m, n};
  stream.launch(desc, reads, {c}, [a, b, c, o, batches, m, n, k, shared_b] {
    const int threads = tbb::this_task_arena::max_concurrency();
    // Many small batches: one batch per task; few large ones: each GEMM uses every thread.
    const bool across_batches = batches >= threads;
    const Accumulator acc(c, batches * m * n);
    const auto one_batch = [&](int64_t i) {
      gemm::Problem p;
      p.m = m, p.n = n, p.k = k;
      p.a = a.unsynchronized_data_ptr() + i * m * k * static_cast<int64_t>(a.itemsize()), p.lda = k, p.a_type = element_of(a);
      p.b = b.unsynchronized_data_ptr() + (shared_b ? 0 : i * n * k * static_cast<int64_t>(b.itemsize()));
      p.ldb = o.b_is_weight ? k : n, p.b_type = element_of(b), p.trans_b = o.b_is_weight;
      p.c = acc.c + i * m * n, p.ldc = n;
      p.compute = o.compute == DType::bf16 ? gemm::Element::bf16 : gemm::Element::f32;
      p.epilogue = epilogue_of(o, n, i * m * n, c);
      run_gemm(p, o.backend, across_batches ? 1 : threads);
    };
    if (across_batches) tbb::parallel_for(int64_t{0}, batches, one_batch);
    else
      for (int64_t i = 0; i < batches; ++i) one_batch(i);
  });
  return c;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Stream& stream) {
  if (x.dim() < 1) throw Error("linear: x must have at least one dimension, got a scalar");
  const int64_t k = x.size(-1);
  Shape out_shape = x.shape();
  const Tensor y = matmul(x.view({-1, k}), weight, {.bias = bias, .b_is_weight = true, .out = x.dtype()}, stream);
  out_shape.back() = y.size(1);
  return y.view(out_shape);
}

}  // namespace cubevec::ops
