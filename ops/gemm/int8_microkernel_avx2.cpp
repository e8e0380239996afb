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
