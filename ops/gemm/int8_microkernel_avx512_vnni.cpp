// Compiled with -mavx512f -mavx512bw -mavx512vnni (see ops/CMakeLists.txt); called only on CPUs with
// AVX512-VNNI. One vpdpbusd per 16 columns and row adds 4 u8 x s8 products into each s32 lane.
#include <immintrin.h>

#include "ops/gemm/int8_kernels.h"

namespace cubevec::ops::gemm {

void int8_microkernel_avx512_vnni(int64_t k_quads, const uint8_t* a, const int8_t* b, int32_t* c, int64_t ldc) {
  constexpr int MR = kMrInt8Avx512;
  __m512i lo[MR], hi[MR];  // row r: columns 0-15 in lo[r], 16-31 in hi[r]
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm512_setzero_si512();
  for (int64_t q = 0; q < k_quads; ++q) {
    const __m512i b0 = _mm512_loadu_si512(b), b1 = _mm512_loadu_si512(b + 64);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      int32_t quad;
      __builtin_memcpy(&quad, a + 4 * r, 4);
      const __m512i ar = _mm512_set1_epi32(quad);
      lo[r] = _mm512_dpbusd_epi32(lo[r], ar, b0);
      hi[r] = _mm512_dpbusd_epi32(hi[r], ar, b1);
    }
    a += 4 * MR;
    b += 4 * kNrInt8Avx512;
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    _mm512_storeu_si512(c + r * ldc, lo[r]);
    _mm512_storeu_si512(c + r * ldc + 16, hi[r]);
  }
}

}  // namespace cubevec::ops::gemm

#include "ops/gemm/int8_epilogue_impl.h"

namespace cubevec::ops::gemm {

// The shift compensation, integer bias, scales and float bias on 16 columns at a time (a masked
// tail), with the per-column terms loaded once per tile; then the float epilogue. The same
// arithmetic as apply_int8_epilogue, whose per-element branches the compiler kept in the loop
// (measured: 15% of an AMX-INT8 GEMM's time went to the scalar version). GCC 12's own
// _mm512_cvtepi32_ps passes an intentionally undefined source to its builtin and then warns about
// it (a false positive, silenced for this function only; clang has no such warning).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
void int8_epilogue_avx512(const Int8Output& p, const int32_t* acc, int64_t ld_acc, int64_t i0, int64_t j0, int64_t rows, int64_t cols) {
  const Int8Epilogue& ep = p.epilogue;
  for (int64_t j = 0; j < cols; j += 16) {
    const int64_t width = cols - j < 16 ? cols - j : 16;
    const __mmask16 mask = static_cast<__mmask16>((1u << width) - 1u);
    // The integer term per column: the bias minus 128 times the column sum (the +128 shift of A).
    __m512i offset = _mm512_mullo_epi32(_mm512_maskz_loadu_epi32(mask, p.column_sums + j0 + j), _mm512_set1_epi32(-128));
    if (ep.int_bias) offset = _mm512_add_epi32(offset, _mm512_maskz_loadu_epi32(mask, ep.int_bias + j0 + j));
    const __m512 col = ep.col_scale ? _mm512_maskz_loadu_ps(mask, ep.col_scale + j0 + j) : _mm512_set1_ps(1.0f);
    const __m512 bias = ep.bias ? _mm512_maskz_loadu_ps(mask, ep.bias + j0 + j) : _mm512_setzero_ps();
    for (int64_t r = 0; r < rows; ++r) {
      const __m512i v = _mm512_add_epi32(_mm512_maskz_loadu_epi32(mask, acc + r * ld_acc + j), offset);
      const float row_scale = ep.row_scale ? ep.row_scale[i0 + r] : 1.0f;
      __m512 y = _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(row_scale));
      y = _mm512_add_ps(_mm512_mul_ps(y, col), bias);
      _mm512_mask_storeu_ps(p.c + (i0 + r) * p.ldc + j0 + j, mask, y);
    }
  }
  if (!ep.rest.empty()) apply_epilogue(ep.rest, p.c + i0 * p.ldc + j0, p.ldc, i0, j0, rows, cols);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace cubevec::ops::gemm
