// Compiled with -mavx2 -mfma (see ops/CMakeLists.txt); called only on CPUs with AVX2 and FMA.
#include <immintrin.h>

#include "ops/gemm/microkernel.h"

namespace cubevec::ops::gemm {

void microkernel_avx2(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate) {
  constexpr int MR = kMrAvx2;
  __m256 lo[MR], hi[MR];
  // Every loop over the rows fully unrolled: left as a loop, the epilogue's indexing keeps the
  // accumulators in memory and GCC 12 stores them all each k step (28% of the FMA peak on a Zen 3).
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
    // The C tile is touched only at the end: fetch its rows now, while the FMAs run (as the AVX-512
    // kernel does; with KC = 256 every C line is visited once per 256 of K).
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 15), _MM_HINT_T0);
  }
  // Four k steps a trip: measured 62-71 -> 80-94 GFLOP/s with the panels in L1 on a Zen 3 core.
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r);
      lo[r] = _mm256_fmadd_ps(ar, b0, lo[r]);
      hi[r] = _mm256_fmadd_ps(ar, b1, hi[r]);
    }
    a += MR;
    b += kNrAvx2;
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* row = c + r * ldc;
    if (accumulate) {
      lo[r] = _mm256_add_ps(lo[r], _mm256_loadu_ps(row));
      hi[r] = _mm256_add_ps(hi[r], _mm256_loadu_ps(row + 8));
    }
    _mm256_storeu_ps(row, lo[r]);
    _mm256_storeu_ps(row + 8, hi[r]);
  }
}

}  // namespace cubevec::ops::gemm

#include "ops/gemm/epilogue_impl.h"

namespace cubevec::ops::gemm {

void epilogue_avx2(const Epilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols) {
  apply_epilogue(ep, c, ldc, i0, j0, rows, cols);
}

}  // namespace cubevec::ops::gemm
