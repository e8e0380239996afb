// Small compositions of fused ops that every DiT block here uses (Flux, Wan): modulation chunks,
// gated residuals through the GEMM epilogue, per-head RoPE and attention on [B, S, heads, head_dim].
#pragma once

#include "models/forward_context.h"
#include "models/layers.h"
#include "models/shared_embeddings.h"
#include "ops/attention.h"
#include "ops/vector_ops.h"

namespace cubevec::models::dit {

// Chunk k of n along the last dim of a [B, n*D] modulation vector: a [B, D] view.
inline Tensor chunk(const Tensor& mod, int64_t n, int64_t k) {
  const int64_t d = mod.size(-1) / n;
  return mod.narrow(mod.dim() - 1, k * d, d);
}

// h + gate * y, gate [B, D] broadcast over the tokens of y [B, S, D]; in h's dtype (computed in
// f32 and rounded once when the dtypes differ, as diffusers' Wan block does with .float()).
inline Tensor gated_add(const Tensor& h, const Tensor& gate, const Tensor& y, const Stream& stream) {
  if (h.dtype() == gate.dtype() && h.dtype() == y.dtype()) return ops::add(h, ops::mul(y, gate.unsqueeze(1), stream), stream);
  const auto f32 = [&](const Tensor& t) { return ops::cast(t, DType::f32, stream); };
  return ops::cast(ops::add(f32(h), ops::mul(f32(y), f32(gate).unsqueeze(1), stream), stream), h.dtype(), stream);
}

// h + gate * linear(x), fused into the GEMM's epilogue when the gate is one vector (B = 1): summed
// in f32 and rounded once to x's dtype.
inline Tensor gated_linear(const Linear& linear, const Tensor& x, const Tensor& h, const Tensor& gate, const Stream& stream) {
  if (gate.size(0) == 1 && h.is_contiguous() && h.dtype() == x.dtype())
    return linear(x, stream, {.residual = h, .gate = ops::cast(gate.reshape({gate.size(1)}), DType::f32, stream)});
  return gated_add(h, gate, linear(x, stream), stream);
}

// Interleaved RoPE on [B, S, heads, head_dim] with a [S, head_dim] table.
inline Tensor rope(const Tensor& x, const RopeTable& table, const Stream& stream) {
  return ops::rotary_position_embedding(x, table.cos, table.sin, ops::RotatedMode::rotated_interleaved, ops::RopeLayout::BSND, stream);
}

// [B, S, heads * head_dim] viewed as [B, S, heads, head_dim]. The heads are counted from x, not the
// config: under tensor parallelism a rank's projections hold only its share of them.
inline Tensor split_heads(const Tensor& x, int64_t head_dim) { return x.reshape({x.size(0), x.size(1), x.size(2) / head_dim, head_dim}); }

}  // namespace cubevec::models::dit
