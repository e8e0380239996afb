// Compiled with -mavx512f -mfma; called only where the CPU has them (ops/conv_direct.cpp).
#include "ops/conv_direct_kernels.h"

#include <immintrin.h>

namespace cubevec::ops::conv_direct {

namespace {

// The lanes of a 16-pixel vector starting at input column `first` that lie inside [0, width).
__mmask16 inside_mask(int64_t first, int64_t width) {
  const int64_t lo = first < 0 ? -first : 0;
  const int64_t hi = width - first >= 16 ? 16 : width - first;
  if (hi <= lo) return 0;
  const unsigned span = (1u << static_cast<unsigned>(hi - lo)) - 1u;
  return static_cast<__mmask16>(span << static_cast<unsigned>(lo));
}

// TILE output channels x PIXELS vectors of 16 pixels from column x0, accumulated in registers over
// every input row, tap and channel, then stored once. Loads outside the input row are masked off
// (the zero padding): a masked-off lane's address is never read, so `at` may be negative.
template <int TILE, int PIXELS>
void block(const RowJob& j, int64_t x0) {
  __m512 acc[TILE][PIXELS];
#pragma GCC unroll 8
  for (int t = 0; t < TILE; ++t)
#pragma GCC unroll 8
    for (int p = 0; p < PIXELS; ++p) acc[t][p] = _mm512_setzero_ps();
  // The masks depend on the tap's column only; channels are the outer loop so that one plane's
  // rows stay in L1 while their taps are read (planes are often a power of two apart in memory).
  __mmask16 masks[kMaxKernelWidth][PIXELS];
  for (int64_t kx = 0; kx < j.kw; ++kx)
    for (int p = 0; p < PIXELS; ++p) masks[kx][p] = inside_mask(x0 + kx - j.pad_x + 16 * p, j.in_w);
  for (int64_t c = 0; c < j.channels; ++c) {
    const intptr_t plane = reinterpret_cast<intptr_t>(j.image + c * j.plane);
    const float* weights = j.weight_t + c * j.taps * kMaxTile;
    for (int r = 0; r < j.rows; ++r) {
      const intptr_t row = plane + static_cast<intptr_t>(j.row_offsets[r] * 4);
      const float* wt = weights + j.row_taps[r] * kMaxTile;
      for (int64_t kx = 0; kx < j.kw; ++kx, wt += kMaxTile) {
        const intptr_t first = row + static_cast<intptr_t>((x0 + kx - j.pad_x) * 4);
        __m512 in[PIXELS];
#pragma GCC unroll 8
        for (int p = 0; p < PIXELS; ++p)
          in[p] = _mm512_maskz_loadu_ps(masks[kx][p], reinterpret_cast<const void*>(first + static_cast<intptr_t>(64 * p)));
#pragma GCC unroll 8
        for (int t = 0; t < TILE; ++t) {
          const __m512 weight = _mm512_set1_ps(wt[t]);
#pragma GCC unroll 8
          for (int p = 0; p < PIXELS; ++p) acc[t][p] = _mm512_fmadd_ps(in[p], weight, acc[t][p]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < TILE; ++t) {
    const __m512 bias = _mm512_set1_ps(j.bias ? j.bias[j.first_channel + t] : 0.0f);
    float* dst = j.out + t * j.out_stride + x0;
    const float* res = j.residual ? j.residual + t * j.out_stride + x0 : nullptr;
    for (int p = 0; p < PIXELS; ++p) {
      const int64_t left = j.out_w - x0 - 16 * p;
      if (left <= 0) break;
      const __mmask16 store = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
      __m512 value = _mm512_add_ps(acc[t][p], bias);
      if (res) value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(store, res + 16 * p));
      _mm512_mask_storeu_ps(dst + 16 * p, store, value);
    }
  }
}

// About 24 accumulators: wide pixel blocks for narrow channel tiles.
template <int TILE>
void row(const RowJob& j) {
  constexpr int kPixels = TILE >= 6 ? 3 : TILE >= 4 ? 4 : 6;
  constexpr int64_t kWidth = 16 * kPixels;
  int64_t x0 = 0;
  for (; x0 + kWidth <= j.out_w; x0 += kWidth) block<TILE, kPixels>(j, x0);
  for (; x0 < j.out_w; x0 += 16) block<TILE, 1>(j, x0);
}

}  // namespace

void convolve_row_avx512(const RowJob& job) {
  switch (job.tile) {
    case 1: return row<1>(job);
    case 2: return row<2>(job);
    case 3: return row<3>(job);
    case 4: return row<4>(job);
    case 5: return row<5>(job);
    case 6: return row<6>(job);
    case 7: return row<7>(job);
    default: return row<8>(job);
  }
}

}  // namespace cubevec::ops::conv_direct
