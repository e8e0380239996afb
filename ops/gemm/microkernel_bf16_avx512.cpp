// Compiled with -mavx512f -mavx512bf16 (see ops/CMakeLists.txt); called only on CPUs with AVX512-BF16.
#include <immintrin.h>

#include "ops/gemm/microkernel_bf16.h"

namespace cubevec::ops::gemm {

namespace {

// C[ROWS x 32] (+)= A x B from an A panel of kMrBf16 rows, of which the first `store_rows` (at most
// ROWS) are written to C: a partial tile computes 4 or 8 rows instead of 12.
template <int ROWS>
void bf16_tile(int store_rows, int64_t kpairs, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc, bool accumulate) {
  __m512 lo[ROWS], hi[ROWS];
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (int r = 0; r < store_rows; ++r) {  // fetch the C tile while the dot products run
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
  }
  for (int64_t k = 0; k < kpairs; ++k) {
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + 32));
#pragma GCC unroll 16
    for (int r = 0; r < ROWS; ++r) {
      int32_t pair;
      __builtin_memcpy(&pair, a + 2 * r, sizeof pair);
      const __m512bh ar = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      lo[r] = _mm512_dpbf16_ps(lo[r], ar, b0);
      hi[r] = _mm512_dpbf16_ps(hi[r], ar, b1);
    }
    a += 2 * kMrBf16;
    b += 2 * kNrBf16;
  }
  // Park the sums in a local tile first: merging straight from the registers with C made GCC
  // spill accumulators inside the k loop.
  alignas(64) float tile[ROWS][kNrBf16];
#pragma GCC unroll 16
  for (int r = 0; r < ROWS; ++r) {
    _mm512_store_ps(tile[r], lo[r]);
    _mm512_store_ps(tile[r] + 16, hi[r]);
  }
  for (int r = 0; r < store_rows; ++r) {
    float* row = c + r * ldc;
    for (int h = 0; h < kNrBf16; h += 16) {
      __m512 v = _mm512_load_ps(tile[r] + h);
      if (accumulate) v = _mm512_add_ps(v, _mm512_loadu_ps(row + h));
      _mm512_storeu_ps(row + h, v);
    }
  }
}

}  // namespace

void microkernel_bf16_avx512(int64_t kpairs, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc, bool accumulate) {
  bf16_tile<kMrBf16>(kMrBf16, kpairs, a, b, c, ldc, accumulate);
}

void microkernel_bf16_avx512_rows(int rows, int64_t kpairs, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc, bool accumulate) {
  if (rows <= 4) bf16_tile<4>(rows, kpairs, a, b, c, ldc, accumulate);
  else if (rows <= 8) bf16_tile<8>(rows, kpairs, a, b, c, ldc, accumulate);
  else bf16_tile<kMrBf16>(rows, kpairs, a, b, c, ldc, accumulate);
}

}  // namespace cubevec::ops::gemm
