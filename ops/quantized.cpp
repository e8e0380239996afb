#include "ops/quantized.h"

#include <cmath>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "ops/vector/common.h"
#include "tensor/caching_allocator.h"

namespace cubevec::ops {

namespace {

void check_vector(const Tensor& t, int64_t n, DType dtype, const char* what) {
  if (!t.defined()) return;
  if (t.dtype() != dtype || !t.is_contiguous() || t.shape() != Shape{n})
    throw Error(std::string("matmul_int8: ") + what + " must be a contiguous " + std::string(dtype_name(dtype)) + " [" + std::to_string(n) +
                "], got " + t.describe());
}

// What both quantizing entry points check and prepare: x's K, the mul_scale parameter, and the
// Vector kernel's arguments (all but the pointers, set when the kernel runs).
struct QuantizePlan {
  int64_t k = 0, m = 0;
  Tensor mul;
  vk::QuantizeArgs args;
};

QuantizePlan plan_quantize(const Tensor& x, int64_t k_padded, const ActivationQuant& q, const char* op, const Stream& stream) {
  detail::float_elem(x, op, "x");
  if (x.dim() < 1) throw Error(std::string(op) + ": x must have at least one dimension, got a scalar");
  QuantizePlan plan;
  plan.k = x.size(-1), plan.m = plan.k == 0 ? 0 : x.numel() / plan.k;
  if (k_padded < plan.k || k_padded % 4 != 0)
    throw Error(std::string(op) + ": k_padded must be a multiple of 4 at least K = " + std::to_string(plan.k) + ", got " +
                std::to_string(k_padded));
  if (!q.dynamic && (!(q.scale > 0) || !std::isfinite(q.scale) || !std::isfinite(q.offset)))
    throw Error(std::string(op) + ": the static scale must be positive and finite and the offset finite, got scale " +
                std::to_string(q.scale) + ", offset " + std::to_string(q.offset));
  if (q.mul_scale.defined()) plan.mul = detail::f32_param(q.mul_scale, {plan.k}, "[K]", op, "mul_scale", stream);
  plan.args.type = detail::elem_of(x.dtype());
  plan.args.width = plan.k, plan.args.padded = k_padded, plan.args.dynamic = q.dynamic, plan.args.scale = q.scale,
  plan.args.offset = q.offset;
  return plan;
}

// The epilogue options checked against the [m, n] output.
void check_int8_options(const Int8MatmulOptions& o, int64_t m, int64_t n) {
  check_vector(o.int_bias, n, DType::i32, "int_bias");
  check_vector(o.col_scale, n, DType::f32, "col_scale");
  check_vector(o.bias, n, DType::f32, "bias");
  check_vector(o.gate, n, DType::f32, "gate");
  if (o.gate.defined() && !o.residual.defined()) throw Error("matmul_int8: a gate needs a residual");
  if (o.residual.defined() && (o.residual.shape() != Shape{m, n} || !o.residual.is_contiguous() ||
                               (o.residual.dtype() != DType::f32 && o.residual.dtype() != DType::bf16)))
    throw Error("matmul_int8: residual must be a contiguous f32 or bf16 [" + std::to_string(m) + ", " + std::to_string(n) + "], got " +
                o.residual.describe());
  if (o.out != DType::f32 && o.out != DType::bf16) throw Error("matmul_int8: the output must be f32 or bf16");
}

// Runs `p` (its A operand or quantize_rows, and row_scale, already set) with the options'
// epilogue into c [m, n]; a bf16 result goes through an f32 scratch. Called inside the kernel.
void run_int8(gemm::Int8Problem p, const Int8MatmulOptions& o, const Tensor& c) {
  const int64_t m = p.m, n = p.n;
  float* scratch =
      c.dtype() == DType::f32 ? nullptr : static_cast<float*>(default_allocator().allocate(static_cast<std::size_t>(m * n) * 4));
  p.c = scratch ? scratch : reinterpret_cast<float*>(c.unsynchronized_data_ptr());
  p.ldc = n;
  auto& ep = p.epilogue;
  ep.int_bias = o.int_bias.defined() ? reinterpret_cast<const int32_t*>(o.int_bias.unsynchronized_data_ptr()) : nullptr;
  ep.col_scale = detail::f32_ptr(o.col_scale);
  ep.bias = detail::f32_ptr(o.bias);
  ep.rest.activation = o.activation;
  if (o.residual.defined()) {
    ep.rest.residual = o.residual.unsynchronized_data_ptr();
    ep.rest.residual_bf16 = o.residual.dtype() == DType::bf16;
    ep.rest.ld_residual = n;
  }
  ep.rest.gate = detail::f32_ptr(o.gate);
  if (scratch) {
    ep.rest.out_bf16 = reinterpret_cast<uint16_t*>(c.unsynchronized_data_ptr());
    ep.rest.ld_out = n;
  }
  try {
    gemm::gemm_int8(p, tbb::this_task_arena::max_concurrency());
  } catch (...) {
    if (scratch) default_allocator().deallocate(scratch);
    throw;
  }
  if (scratch) default_allocator().deallocate(scratch);
}

std::vector<Tensor> option_reads(const Int8MatmulOptions& o) {
  std::vector<Tensor> reads;
  for (const Tensor* t : {&o.int_bias, &o.col_scale, &o.bias, &o.residual, &o.gate})
    if (t->defined()) reads.push_back(*t);
  return reads;
}

}  // namespace

QuantizedActivations quantize_activations(const Tensor& x, int64_t k_padded, const ActivationQuant& q, const Stream& stream) {
  const QuantizePlan plan = plan_quantize(x, k_padded, q, "quantize_activations", stream);
  const Tensor xc = detail::contiguous_on(x, stream), mul = plan.mul;
  QuantizedActivations out;
  out.k = plan.k;
  out.data = stream.device().empty({plan.m, k_padded}, DType::u8, stream);
  out.row_scale = stream.device().empty({plan.m}, DType::f32, stream);
  std::vector<Tensor> reads{xc};
  if (mul.defined()) reads.push_back(mul);
  const double bytes = static_cast<double>(xc.nbytes() + out.data.nbytes() + out.row_scale.nbytes());
  const vk::Kernels* kernels = &vk::kernels();
  stream.launch(
      {q.dynamic ? "quantize_per_token" : "quantize_static", Unit::vector, 4.0 * static_cast<double>(xc.numel()), bytes, DType::f32}, reads,
      {out.data, out.row_scale}, [xc, mul, out, args = plan.args, kernels] {
        vk::QuantizeArgs a = args;
        a.x = xc.unsynchronized_data_ptr();
        a.mul_scale = detail::f32_ptr(mul);
        a.out = reinterpret_cast<uint8_t*>(out.data.unsynchronized_data_ptr());
        a.row_scale = reinterpret_cast<float*>(out.row_scale.unsynchronized_data_ptr());
        detail::parallel_chunks(out.data.size(0), a.width, [&](int64_t r0, int64_t r1) { kernels->quantize(a, r0, r1); });
      });
  return out;
}

PackedInt8Weight pack_int8_weight(const Tensor& w, int threads) {
  if (!w.defined() || w.dtype() != DType::i8 || w.dim() != 2)
    throw Error("pack_int8_weight: expected an i8 weight [N, K], got " + (w.defined() ? w.describe() : std::string("nothing")));
  const Tensor c = w.contiguous();
  const gemm::Int8Isa isa = gemm::chosen_int8_isa(threads > 0 ? threads : tbb::this_task_arena::max_concurrency());
  return gemm::pack_int8_weight(c.data<int8_t>(), c.size(0), c.size(1), c.size(1), isa);
}

Tensor matmul_int8(const QuantizedActivations& a, const PackedInt8Weight& w, const Int8MatmulOptions& o, const Stream& stream) {
  if (!w) throw Error("matmul_int8: no packed weight");
  if (!a.data.defined() || a.data.dtype() != DType::u8 || a.data.dim() != 2 || a.data.size(1) != 4 * w->k_quads || a.k != w->k)
    throw Error("matmul_int8: the activations must be quantized for K = " + std::to_string(w->k) + " (padded to " +
                std::to_string(4 * w->k_quads) + "), got " + (a.data.defined() ? a.data.describe() : std::string("nothing")) +
                " for K = " + std::to_string(a.k));
  const int64_t m = a.data.size(0), n = w->n;
  check_int8_options(o, m, n);
  Tensor c = stream.device().empty({m, n}, o.out, stream);
  std::vector<Tensor> reads = option_reads(o);
  reads.push_back(a.data), reads.push_back(a.row_scale);
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(w->k);
  const double bytes = static_cast<double>(a.data.nbytes() + w->bytes() + c.nbytes());
  KernelDesc desc{"matmul_int8", Unit::cube, flops, bytes, DType::i8};
  desc.cube_work = {1, m, n};
  stream.launch(desc, reads, {c}, [a, w, o, c, m, n] {
    gemm::Int8Problem p;
    p.m = m, p.n = n, p.b = w.get();
    p.a = reinterpret_cast<const uint8_t*>(a.data.unsynchronized_data_ptr());
    p.lda = a.data.size(1);
    p.epilogue.row_scale = reinterpret_cast<const float*>(a.row_scale.unsynchronized_data_ptr());
    run_int8(p, o, c);
  });
  return c;
}

Tensor matmul_int8_quantizing(const Tensor& x, const ActivationQuant& q, const PackedInt8Weight& w, const Int8MatmulOptions& o,
                              const Stream& stream) {
  if (!w) throw Error("matmul_int8_quantizing: no packed weight");
  const int64_t k_padded = 4 * w->k_quads;
  const QuantizePlan plan = plan_quantize(x, k_padded, q, "matmul_int8_quantizing", stream);
  if (plan.k != w->k)
    throw Error("matmul_int8_quantizing: x has K = " + std::to_string(plan.k) + ", the weight " + std::to_string(w->k) + " (" +
                x.describe() + ")");
  const int64_t m = plan.m, n = w->n;
  check_int8_options(o, m, n);
  const Tensor xc = detail::contiguous_on(x, stream), mul = plan.mul;
  Tensor c = stream.device().empty({m, n}, o.out, stream);
  std::vector<Tensor> reads = option_reads(o);
  reads.push_back(xc);
  if (mul.defined()) reads.push_back(mul);
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(w->k);
  const double bytes = static_cast<double>(xc.nbytes() + w->bytes() + c.nbytes());
  KernelDesc desc{q.dynamic ? "matmul_int8_quantize_per_token" : "matmul_int8_quantize_static", Unit::cube, flops, bytes, DType::i8};
  desc.cube_work = {1, m, n};
  const vk::Kernels* kernels = &vk::kernels();
  stream.launch(desc, reads, {c}, [xc, mul, w, o, c, m, n, args = plan.args, kernels] {
    gemm::Int8Problem p;
    p.m = m, p.n = n, p.b = w.get();
    const std::byte* x_bytes = xc.unsynchronized_data_ptr();
    const int64_t row_bytes = args.width * static_cast<int64_t>(dtype_size(xc.dtype()));
    const float* mul_scale = detail::f32_ptr(mul);
    // The same Vector kernel as quantize_activations, on the block's rows (hence the same bits).
    p.quantize_rows = [=](int64_t r0, int64_t r1, uint8_t* out, int64_t ld_out, float* row_scale) {
      vk::QuantizeArgs a = args;
      a.x = x_bytes + r0 * row_bytes;
      a.mul_scale = mul_scale;
      a.padded = ld_out;
      a.out = out;
      a.row_scale = row_scale;
      kernels->quantize(a, 0, r1 - r0);
    };
    run_int8(p, o, c);
  });
  Shape shape = x.shape();
  shape.back() = n;
  return c.reshape(shape);
}

}  // namespace cubevec::ops
