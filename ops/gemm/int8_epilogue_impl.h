// The int8 GEMM's epilogue body, included by each ISA's micro-kernel file so the compiler
// vectorizes it for that ISA (`static`: each copy private to its file): the shift compensation,
// the integer bias, the row and column scales, the float bias, then the float GEMM's epilogue
// (activation, residual, gate, bf16 store) on the f32 row.
#pragma once

#include "ops/gemm/epilogue_impl.h"
#include "ops/gemm/int8_kernels.h"

namespace cubevec::ops::gemm {

// The integer tile to floats in C: the shift compensation, the integer bias, the row and column
// scales and the float bias (everything before the float epilogue).
static inline void dequantize_int8_tile(const Int8Output& p, const int32_t* acc, int64_t ld_acc, int64_t i0, int64_t j0, int64_t rows,
                                        int64_t cols) {
  const Int8Epilogue& ep = p.epilogue;
  const int32_t* sums = p.column_sums + j0;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* in = acc + r * ld_acc;
    float* out = p.c + (i0 + r) * p.ldc + j0;
    const float row_scale = ep.row_scale ? ep.row_scale[i0 + r] : 1.0f;
    for (int64_t j = 0; j < cols; ++j) {
      int32_t v = in[j] - 128 * sums[j];  // undo the +128 shift of A
      if (ep.int_bias) v += ep.int_bias[j0 + j];
      float y = static_cast<float>(v) * row_scale;
      if (ep.col_scale) y *= ep.col_scale[j0 + j];
      if (ep.bias) y += ep.bias[j0 + j];
      out[j] = y;
    }
  }
}

static inline void apply_int8_epilogue(const Int8Output& p, const int32_t* acc, int64_t ld_acc, int64_t i0, int64_t j0, int64_t rows,
                                       int64_t cols) {
  dequantize_int8_tile(p, acc, ld_acc, i0, j0, rows, cols);
  if (!p.epilogue.rest.empty()) apply_epilogue(p.epilogue.rest, p.c + i0 * p.ldc + j0, p.ldc, i0, j0, rows, cols);
}

}  // namespace cubevec::ops::gemm
