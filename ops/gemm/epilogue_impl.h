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

// c[r][j] += sum_q a[i0 + r][q] b[q][j0 + j] over a tile: 16 columns of up to 4 rows held in
// accumulators across the rank (GCC's vector extension: zmm FMAs with AVX-512, ymm pairs with AVX2),
// so each row is loaded and stored once and each b vector serves 4 rows.
static inline void apply_low_rank(const Epilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols) {
  typedef float Lanes __attribute__((vector_size(64)));
  constexpr int64_t kLanes = 16, kRows = 4;
  const int64_t rank = ep.low_rank, lda = ep.ld_low_rank_a, ldb = ep.ld_low_rank_b;
  const float* b0 = ep.low_rank_b + j0;
  int64_t j = 0;
  for (; j + kLanes <= cols; j += kLanes) {
    int64_t r = 0;
    for (; r + kRows <= rows; r += kRows) {
      const float* a = ep.low_rank_a + (i0 + r) * lda;
      Lanes acc[kRows], b;
      for (int64_t t = 0; t < kRows; ++t) __builtin_memcpy(&acc[t], c + (r + t) * ldc + j, sizeof b);
      for (int64_t q = 0; q < rank; ++q) {
        __builtin_memcpy(&b, b0 + q * ldb + j, sizeof b);
        for (int64_t t = 0; t < kRows; ++t) acc[t] += a[t * lda + q] * b;
      }
      for (int64_t t = 0; t < kRows; ++t) __builtin_memcpy(c + (r + t) * ldc + j, &acc[t], sizeof b);
    }
    for (; r < rows; ++r) {
      const float* a = ep.low_rank_a + (i0 + r) * lda;
      Lanes acc, b;
      __builtin_memcpy(&acc, c + r * ldc + j, sizeof acc);
      for (int64_t q = 0; q < rank; ++q) {
        __builtin_memcpy(&b, b0 + q * ldb + j, sizeof b);
        acc += a[q] * b;
      }
      __builtin_memcpy(c + r * ldc + j, &acc, sizeof acc);
    }
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t jj = j; jj < cols; ++jj) {
      const float* a = ep.low_rank_a + (i0 + r) * lda;
      float sum = c[r * ldc + jj];
      for (int64_t q = 0; q < rank; ++q) sum += a[q] * b0[q * ldb + jj];
      c[r * ldc + jj] = sum;
    }
}

static inline void apply_epilogue(const Epilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols) {
  if (ep.low_rank_a) apply_low_rank(ep, c, ldc, i0, j0, rows, cols);  // an addition like the bias: before the activation
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
