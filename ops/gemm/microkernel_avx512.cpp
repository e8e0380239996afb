// Compiled with -mavx512f -mfma (see ops/CMakeLists.txt); called only on CPUs with AVX-512F.
#include <immintrin.h>

#include "ops/gemm/microkernel.h"

namespace cubevec::ops::gemm {

namespace {

// kPrefetch > 0: the A and B panel lines kPrefetch k steps ahead are prefetched into L1 (the B
// micro-panel, KC x 32 floats, is larger than L1 and streams from L2). The calibration measures
// both forms: how far ahead pays depends on the CPU's L2 latency and its hardware prefetchers.
// ROWS < MR: a partial tile, ROWS rows computed from the MR-row panel and the first `store_rows`
// (at most ROWS) written (the last 4 rows of M = 256 through all 14 cost 6% of 256 x 3072 x 3072).
template <int kPrefetch, int ROWS = kMrAvx512>
void microkernel(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate, int store_rows = ROWS) {
  constexpr int MR = kMrAvx512;
  __m512 lo[ROWS], hi[ROWS];  // row r: columns 0-15 in lo[r], 16-31 in hi[r]
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
    // The C tile is touched only at the end: fetch its rows now, while the FMAs run (its rows are
    // far apart, so each is a likely cache miss that would otherwise stall the stores).
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) {
    if (r >= store_rows) break;
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
  }
  for (int64_t k = 0; k < kc; ++k) {
    if constexpr (kPrefetch > 0) {
      _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetch * kNrAvx512), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(b + kPrefetch * kNrAvx512 + 16), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(a + kPrefetch * MR), _MM_HINT_T0);
    }
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r]);
      lo[r] = _mm512_fmadd_ps(ar, b0, lo[r]);
      hi[r] = _mm512_fmadd_ps(ar, b1, hi[r]);
    }
    a += MR;
    b += kNrAvx512;
  }
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) {
    if (r >= store_rows) break;
    float* row = c + r * ldc;
    if (accumulate) {
      lo[r] = _mm512_add_ps(lo[r], _mm512_loadu_ps(row));
      hi[r] = _mm512_add_ps(hi[r], _mm512_loadu_ps(row + 16));
    }
    _mm512_storeu_ps(row, lo[r]);
    _mm512_storeu_ps(row + 16, hi[r]);
  }
}

// A partial tile on the narrowest form that holds its rows.
template <int kPrefetch>
void partial_tile(int rows, int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate) {
  if (rows <= 4) microkernel<kPrefetch, 4>(kc, a, b, c, ldc, accumulate, rows);
  else if (rows <= 8) microkernel<kPrefetch, 8>(kc, a, b, c, ldc, accumulate, rows);
  else microkernel<kPrefetch>(kc, a, b, c, ldc, accumulate, rows);
}

}  // namespace

void microkernel_avx512(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate) {
  microkernel<0>(kc, a, b, c, ldc, accumulate);
}

void microkernel_avx512_prefetch(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate) {
  microkernel<kPrefetchAvx512>(kc, a, b, c, ldc, accumulate);
}

void microkernel_avx512_rows(int rows, int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate) {
  partial_tile<0>(rows, kc, a, b, c, ldc, accumulate);
}

void microkernel_avx512_prefetch_rows(int rows, int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate) {
  partial_tile<kPrefetchAvx512>(rows, kc, a, b, c, ldc, accumulate);
}

}  // namespace cubevec::ops::gemm

#include "ops/gemm/epilogue_impl.h"

namespace cubevec::ops::gemm {

void epilogue_avx512(const Epilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols) {
  apply_epilogue(ep, c, ldc, i0, j0, rows, cols);
}

}  // namespace cubevec::ops::gemm
