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

void int8_epilogue_avx512(const Int8Output& p, const int32_t* acc, int64_t ld_acc, int64_t i0, int64_t j0, int64_t rows, int64_t cols) {
  apply_int8_epilogue(p, acc, ld_acc, i0, j0, rows, cols);
}

}  // namespace cubevec::ops::gemm
