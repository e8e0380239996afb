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

}  // namespace

QuantizedActivations quantize_activations(const Tensor& x, int64_t k_padded, const ActivationQuant& q, const Stream& stream) {
  detail::float_elem(x, "quantize_activations", "x");
  if (x.dim() < 1) throw Error("quantize_activations: x must have at least one dimension, got a scalar");
  const int64_t k = x.size(-1), m = k == 0 ? 0 : x.numel() / k;
  if (k_padded < k || k_padded % 4 != 0)
    throw Error("quantize_activations: k_padded must be a multiple of 4 at least K = " + std::to_string(k) + ", got " +
                std::to_string(k_padded));
  if (!q.dynamic && (!(q.scale > 0) || !std::isfinite(q.scale) || !std::isfinite(q.offset)))
    throw Error("quantize_activations: the static scale must be positive and finite and the offset finite, got scale " +
                std::to_string(q.scale) + ", offset " + std::to_string(q.offset));
  const Tensor mul =
      q.mul_scale.defined() ? detail::f32_param(q.mul_scale, {k}, "[K]", "quantize_activations", "mul_scale", stream) : Tensor();
  const Tensor xc = detail::contiguous_on(x, stream);
  QuantizedActivations out;
  out.k = k;
  out.data = stream.device().empty({m, k_padded}, DType::u8, stream);
  out.row_scale = stream.device().empty({m}, DType::f32, stream);
  std::vector<Tensor> reads{xc};
  if (mul.defined()) reads.push_back(mul);
  const double bytes = static_cast<double>(xc.nbytes() + out.data.nbytes() + out.row_scale.nbytes());
  const vk::Kernels* kernels = &vk::kernels();
  vk::QuantizeArgs args;
  args.type = detail::elem_of(xc.dtype());
  args.width = k, args.padded = k_padded, args.dynamic = q.dynamic, args.scale = q.scale, args.offset = q.offset;
  stream.launch(
      {q.dynamic ? "quantize_per_token" : "quantize_static", Unit::vector, 4.0 * static_cast<double>(xc.numel()), bytes, DType::f32}, reads,
      {out.data, out.row_scale}, [xc, mul, out, args, kernels] {
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
  Tensor c = stream.device().empty({m, n}, o.out, stream);
  std::vector<Tensor> reads{a.data, a.row_scale};
  for (const Tensor* t : {&o.int_bias, &o.col_scale, &o.bias, &o.residual, &o.gate})
    if (t->defined()) reads.push_back(*t);
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(w->k);
  const double bytes = static_cast<double>(a.data.nbytes() + w->bytes() + c.nbytes());
  KernelDesc desc{"matmul_int8", Unit::cube, flops, bytes, DType::i8};
  desc.cube_work = {1, m, n};
  stream.launch(desc, reads, {c}, [a, w, o, c, m, n] {
    gemm::Int8Problem p;
    p.m = m, p.n = n;
    p.a = reinterpret_cast<const uint8_t*>(a.data.unsynchronized_data_ptr());
    p.lda = a.data.size(1);
    p.b = w.get();
    float* scratch =
        c.dtype() == DType::f32 ? nullptr : static_cast<float*>(default_allocator().allocate(static_cast<std::size_t>(m * n) * 4));
    p.c = scratch ? scratch : reinterpret_cast<float*>(c.unsynchronized_data_ptr());
    p.ldc = n;
    auto& ep = p.epilogue;
    ep.int_bias = o.int_bias.defined() ? reinterpret_cast<const int32_t*>(o.int_bias.unsynchronized_data_ptr()) : nullptr;
    ep.row_scale = reinterpret_cast<const float*>(a.row_scale.unsynchronized_data_ptr());
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
  });
  return c;
}

}  // namespace cubevec::ops
