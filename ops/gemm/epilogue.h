// What a GEMM does to its result before storing it, fused into the Cube kernel:
//   x = A B (+ bias[j]) (+ sum_q low_rank_a[i][q] low_rank_b[q][j]);  x = act(x);  if residual: x = residual[i][j] + (gate ? gate[j] : 1) * x;
//   then optionally x is stored as bf16 (rounded to nearest even) for a bf16 result.
// The residual form is the gated residual add of DiT blocks (hidden + gate * attn_out).
#pragma once

#include <cstdint>

namespace cubevec::ops::gemm {

enum class Activation : uint8_t { none, gelu_tanh, silu };

struct Epilogue {
  const float* bias = nullptr;  // [N] or null
  Activation activation = Activation::none;
  const void* residual = nullptr;  // [M, N] (ld_residual), f32 or (residual_bf16) bf16, or null
  int64_t ld_residual = 0;
  const float* gate = nullptr;  // [N] or null (only with residual)
  bool residual_bf16 = false;
  // When set, the finished values are also stored here rounded to bf16 (row stride ld_out, the same
  // (i, j) coordinates as C): a bf16 result, with C serving as the f32 accumulator.
  uint16_t* out_bf16 = nullptr;
  int64_t ld_out = 0;
  // A low-rank update added before the activation (a runtime LoRA, models/lora_runtime.h): f32
  // low_rank_a [M, low_rank] (row stride ld_low_rank_a) times low_rank_b [low_rank, N] (row stride
  // ld_low_rank_b); both small enough to stay in cache while the tiles are finished.
  const float* low_rank_a = nullptr;
  const float* low_rank_b = nullptr;
  int64_t ld_low_rank_a = 0, ld_low_rank_b = 0, low_rank = 0;

  bool empty() const { return !bias && !low_rank_a && activation == Activation::none && !residual && !out_bf16; }
};

// Applies `ep` to rows [0, rows) x columns [0, cols) of a tile whose top-left element is C[i0][j0].
using EpilogueFn = void (*)(const Epilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols);

void epilogue_avx512(const Epilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols);
void epilogue_avx2(const Epilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols);
void epilogue_portable(const Epilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols);

}  // namespace cubevec::ops::gemm
