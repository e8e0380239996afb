// The body of the epilogue, included by each ISA's micro-kernel file so the compiler vectorizes
// it for that ISA. `static` keeps each copy private to its file (see ops/vector_math.h).
#pragma once

#include "ops/gemm/epilogue.h"
#include "ops/vector_math.h"

namespace cubevec::ops::gemm {

// bf16 <-> f32 here rather than tensor/half.h's inline functions: an inline function compiled into
// an ISA-specific file could be the copy the linker keeps for every caller.
static inline float epilogue_bf16_to_f32(uint16_t bits) { return __builtin_bit_cast(float, static_cast<uint32_t>(bits) << 16); }
static inline uint16_t epilogue_f32_to_bf16(float value) {  // nearest even; NaN stays NaN
  const uint32_t x = __builtin_bit_cast(uint32_t, value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static inline void apply_epilogue(const Epilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = c + r * ldc;
    if (ep.bias)
      for (int64_t j = 0; j < cols; ++j) row[j] += ep.bias[j0 + j];
    if (ep.activation == Activation::gelu_tanh)
      for (int64_t j = 0; j < cols; ++j) row[j] = vmath::gelu_tanh(row[j]);
    else if (ep.activation == Activation::silu)
      for (int64_t j = 0; j < cols; ++j) row[j] = vmath::silu(row[j]);
    if (ep.residual) {
      if (ep.residual_bf16) {
        const uint16_t* res = static_cast<const uint16_t*>(ep.residual) + (i0 + r) * ep.ld_residual + j0;
        if (ep.gate)
          for (int64_t j = 0; j < cols; ++j) row[j] = epilogue_bf16_to_f32(res[j]) + ep.gate[j0 + j] * row[j];
        else
          for (int64_t j = 0; j < cols; ++j) row[j] += epilogue_bf16_to_f32(res[j]);
      } else {
        const float* res = static_cast<const float*>(ep.residual) + (i0 + r) * ep.ld_residual + j0;
        if (ep.gate)
          for (int64_t j = 0; j < cols; ++j) row[j] = res[j] + ep.gate[j0 + j] * row[j];
        else
          for (int64_t j = 0; j < cols; ++j) row[j] += res[j];
      }
    }
    if (ep.out_bf16) {
      uint16_t* out = ep.out_bf16 + (i0 + r) * ep.ld_out + j0;
      for (int64_t j = 0; j < cols; ++j) out[j] = epilogue_f32_to_bf16(row[j]);
    }
  }
}

}  // namespace cubevec::ops::gemm
