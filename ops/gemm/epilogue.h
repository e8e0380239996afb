// What a GEMM does to its result before storing it, fused into the Cube kernel:
//   x = A B (+ bias[j]);  x = act(x);  if residual: x = residual[i][j] + (gate ? gate[j] : 1) * x.
// The last form is the gated residual add of DiT blocks (hidden + gate * attn_out).
#pragma once

#include <cstdint>

namespace cubevec::ops::gemm {

enum class Activation : uint8_t { none, gelu_tanh, silu };

struct Epilogue {
  const float* bias = nullptr;      // [N] or null
  Activation activation = Activation::none;
  const float* residual = nullptr;  // [M, N] (ld_residual) or null
  int64_t ld_residual = 0;
  const float* gate = nullptr;      // [N] or null (only with residual)

  bool empty() const { return !bias && activation == Activation::none && !residual; }
};

// Applies `ep` to rows [0, rows) x columns [0, cols) of a tile whose top-left element is C[i0][j0].
using EpilogueFn = void (*)(const Epilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols);

void epilogue_avx512(const Epilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols);
void epilogue_avx2(const Epilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols);
void epilogue_portable(const Epilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols);

}  // namespace cubevec::ops::gemm
