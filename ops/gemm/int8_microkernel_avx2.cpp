// Compiled with -mavx2 -mfma (see ops/CMakeLists.txt); called only on CPUs with AVX2. The int8 tile
// for AVX2 cores without any VNNI (AMD Zen 1-3, Intel Haswell to Comet Lake): vpmaddwd on 16-bit
// lanes. vpmaddubsw would take u8 x s8 directly but saturates its 16-bit pair sums (255 x 127 x 2
// does not fit), so both operands are widened: A by the packing (u16 quads), B here, 16 bytes at a
// time. One vpmaddwd multiplies a column's quad in two lanes (k 0-1 and k 2-3) that are added at
// the end.
#include <immintrin.h>

#include "ops/gemm/int8_kernels.h"

namespace cubevec::ops::gemm {

void int8_microkernel_avx2(int64_t k_quads, const uint8_t* a_bytes, const int8_t* b, int32_t* c, int64_t ldc) {
  constexpr int MR = kMrInt8Avx2;
  const auto* a = reinterpret_cast<const uint16_t*>(a_bytes);  // [k_quads][MR][4] u16
  // Row r: columns 0-3 in lo[r], 4-7 in hi[r], two lanes a column (the sums over k 0-1 and k 2-3).
  __m256i lo[MR], hi[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
  for (int64_t q = 0; q < k_quads; ++q) {
    const __m256i b_lo = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
    const __m256i b_hi = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16)));
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      long long quad;
      __builtin_memcpy(&quad, a + 4 * r, 8);
      const __m256i ar = _mm256_set1_epi64x(quad);
      // In assembly so that each sum is added in place: from intrinsics GCC 12 copies every
      // accumulator once a quad (or spills it), which costs more issue slots than the multiplies.
      __m256i product;
      __asm__("vpmaddwd %[b], %[a], %[t]\n\tvpaddd %[t], %[acc], %[acc]"
              : [acc] "+x"(lo[r]), [t] "=x"(product)
              : [a] "x"(ar), [b] "x"(b_lo));
      __asm__("vpmaddwd %[b], %[a], %[t]\n\tvpaddd %[t], %[acc], %[acc]"
              : [acc] "+x"(hi[r]), [t] "=x"(product)
              : [a] "x"(ar), [b] "x"(b_hi));
    }
    a += 4 * MR;
    b += 4 * kNrInt8Avx2;
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    // hadd gives columns [0 1 4 5 | 2 3 6 7]; the permute puts them in order.
    const __m256i sums = _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo[r], hi[r]), _MM_SHUFFLE(3, 1, 2, 0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc), sums);
  }
}

}  // namespace cubevec::ops::gemm

#include "ops/gemm/int8_epilogue_impl.h"

namespace cubevec::ops::gemm {

// The shift compensation, integer bias, scales and float bias on 8 columns at a time, with the
// per-column terms loaded once per tile; then the float epilogue, compiled here for AVX2 (the
// portable file's copy is baseline SSE2: its GELU ran one float at a time, 8% of a W8A8 FLUX
// block's time on a Zen 3). The same steps in the same order as dequantize_int8_tile, which does a
// tail of fewer than 8 columns (vmaskmovps stores are microcoded and slow on AMD's cores); GCC
// fuses the scale and bias into an FMA here (see the top-level CMakeLists.txt on contraction),
// where the portable file has none, so the last bit may differ from the portable kernel's.
// Also the AVX-VNNI kernel's epilogue (every CPU with AVX-VNNI has AVX2 and FMA).
void int8_epilogue_avx2(const Int8Output& p, const int32_t* acc, int64_t ld_acc, int64_t i0, int64_t j0, int64_t rows, int64_t cols) {
  const Int8Epilogue& ep = p.epilogue;
  const int64_t full = cols / 8 * 8;
  for (int64_t j = 0; j < full; j += 8) {
    // The integer term per column: the bias minus 128 times the column sum (the +128 shift of A).
    __m256i offset =
        _mm256_mullo_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.column_sums + j0 + j)), _mm256_set1_epi32(-128));
    if (ep.int_bias) offset = _mm256_add_epi32(offset, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ep.int_bias + j0 + j)));
    const __m256 col = ep.col_scale ? _mm256_loadu_ps(ep.col_scale + j0 + j) : _mm256_set1_ps(1.0f);
    const __m256 bias = ep.bias ? _mm256_loadu_ps(ep.bias + j0 + j) : _mm256_setzero_ps();
    for (int64_t r = 0; r < rows; ++r) {
      const __m256i v = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + r * ld_acc + j)), offset);
      const float row_scale = ep.row_scale ? ep.row_scale[i0 + r] : 1.0f;
      __m256 y = _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(row_scale));
      y = _mm256_add_ps(_mm256_mul_ps(y, col), bias);
      _mm256_storeu_ps(p.c + (i0 + r) * p.ldc + j0 + j, y);
    }
  }
  if (full < cols) dequantize_int8_tile(p, acc + full, ld_acc, i0, j0 + full, rows, cols - full);
  if (!ep.rest.empty()) apply_epilogue(ep.rest, p.c + i0 * p.ldc + j0, p.ldc, i0, j0, rows, cols);
}

}  // namespace cubevec::ops::gemm
