// Compiled with -mavx2 -mavxvnni (see ops/CMakeLists.txt); called only on CPUs with AVX-VNNI (the
// VEX-encoded vpdpbusd of AVX2-class cores).
#include <immintrin.h>

#include "ops/gemm/int8_kernels.h"

namespace cubevec::ops::gemm {

void int8_microkernel_avx_vnni(int64_t k_quads, const uint8_t* a, const int8_t* b, int32_t* c, int64_t ldc) {
  constexpr int MR = kMrInt8AvxVnni;
  __m256i lo[MR], hi[MR];  // row r: columns 0-7 in lo[r], 8-15 in hi[r]
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
  for (int64_t q = 0; q < k_quads; ++q) {
    const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32));
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      int32_t quad;
      __builtin_memcpy(&quad, a + 4 * r, 4);
      const __m256i ar = _mm256_set1_epi32(quad);
      lo[r] = _mm256_dpbusd_avx_epi32(lo[r], ar, b0);
      hi[r] = _mm256_dpbusd_avx_epi32(hi[r], ar, b1);
    }
    a += 4 * MR;
    b += 4 * kNrInt8AvxVnni;
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc), lo[r]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + r * ldc + 8), hi[r]);
  }
}

}  // namespace cubevec::ops::gemm
