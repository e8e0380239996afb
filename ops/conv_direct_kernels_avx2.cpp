// Compiled with -mavx2 -mfma; called only where the CPU has them (ops/conv_direct.cpp). The same
// loop as the AVX-512 kernel in 8-pixel vectors, shaped for 16 registers: at most 4 output
// channels at a time (a job's tile of up to 8 is done in two halves, each reading the input rows
// again from L1), and unmasked loads except in the blocks that touch the padding.
#include "ops/conv_direct_kernels.h"

#include <immintrin.h>

#include <algorithm>

namespace cubevec::ops::conv_direct {

namespace {

constexpr int kLanes = 8;

// The lanes of an 8-pixel vector starting at input column `first` that lie inside [0, width), as
// the sign bits vmaskmovps reads.
__m256i inside_mask(int64_t first, int64_t width) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i column = _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int>(first)));
  const __m256i below_width = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(width)), column);
  const __m256i not_negative = _mm256_cmpgt_epi32(column, _mm256_set1_epi32(-1));
  return _mm256_and_si256(below_width, not_negative);
}

// Which channels of the job this pass computes: [first, first + TILE) of the job's tile.
struct Pass {
  const RowJob& job;
  int first;  // within the job's tile
};

// TILE output channels x PIXELS vectors of 8 pixels from column x0, accumulated in registers over
// every input row, tap and channel, then stored once. EDGE: some loads reach into the padding and
// are masked (a masked-off lane's address is never read, so `at` may be outside the row); the
// blocks in between load without masks. KW and ROWS: the kernel's width and the input rows when
// known at compile time (3 and 3, a 3x3 kernel away from the top and bottom: the VAEs'), so that a
// channel's taps are one unrolled run; else 0 (j.kw, j.rows).
template <int TILE, int PIXELS, bool EDGE, int KW, int ROWS>
void block(const Pass& pass, int64_t x0) {
  const RowJob& j = pass.job;
  const int64_t kw = KW > 0 ? KW : j.kw;
  const int rows = ROWS > 0 ? ROWS : j.rows;
  __m256 acc[TILE][PIXELS];
#pragma GCC unroll 8
  for (int t = 0; t < TILE; ++t)
#pragma GCC unroll 8
    for (int p = 0; p < PIXELS; ++p) acc[t][p] = _mm256_setzero_ps();
  __m256i masks[EDGE ? kMaxKernelWidth : 1][PIXELS];
  if constexpr (EDGE)
    for (int64_t kx = 0; kx < kw; ++kx)
      for (int p = 0; p < PIXELS; ++p) masks[kx][p] = inside_mask(x0 + kx - j.pad_x + kLanes * p, j.in_w);
  // Each input row's bytes from a plane's start to the block's first tap, and its first weight
  // within a channel's, computed once for the block.
  intptr_t row_bytes[ROWS > 0 ? ROWS : 1];
  int64_t row_weights[ROWS > 0 ? ROWS : 1];
  const auto bytes_of = [&](int r) { return static_cast<intptr_t>(4 * (j.row_offsets[r] + x0 - j.pad_x)); };
  if constexpr (ROWS > 0)
    for (int r = 0; r < ROWS; ++r) row_bytes[r] = bytes_of(r), row_weights[r] = j.row_taps[r] * kMaxTile;
  // The next channel's rows are prefetched a channel ahead: without it the first load of each row
  // waited on L2 (one block reads 2-3 lines from each of channels x rows rows, too many streams
  // for the hardware prefetcher). `span`: the bytes one row gives the block.
  const intptr_t span = 4 * (kLanes * PIXELS + kw - 1);
  for (int64_t c = 0; c < j.channels; ++c) {
    const intptr_t plane = reinterpret_cast<intptr_t>(j.image + c * j.plane);
    if (c + 1 < j.channels)
      for (int r = 0; r < rows; ++r)
        for (intptr_t byte = 0; byte < span + 63; byte += 64)
          _mm_prefetch(
              reinterpret_cast<const char*>(plane + 4 * j.plane + (ROWS > 0 ? row_bytes[r] : bytes_of(r)) + std::min(byte, span - 1)),
              _MM_HINT_T0);
    const float* weights = j.weight_t + c * j.taps * kMaxTile + pass.first;
#pragma GCC unroll 4
    for (int r = 0; r < rows; ++r) {
      const intptr_t row = plane + (ROWS > 0 ? row_bytes[r] : bytes_of(r));
      const float* wt = weights + (ROWS > 0 ? row_weights[r] : j.row_taps[r] * kMaxTile);
#pragma GCC unroll 4
      for (int64_t kx = 0; kx < kw; ++kx, wt += kMaxTile) {
        const intptr_t first = row + static_cast<intptr_t>(kx * 4);
        __m256 in[PIXELS];
#pragma GCC unroll 8
        for (int p = 0; p < PIXELS; ++p) {
          const auto* at = reinterpret_cast<const float*>(first + static_cast<intptr_t>(4 * kLanes * p));
          if constexpr (EDGE) in[p] = _mm256_maskload_ps(at, masks[kx][p]);
          else in[p] = _mm256_loadu_ps(at);
        }
#pragma GCC unroll 8
        for (int t = 0; t < TILE; ++t) {
          const __m256 weight = _mm256_broadcast_ss(wt + t);
#pragma GCC unroll 8
          for (int p = 0; p < PIXELS; ++p) acc[t][p] = _mm256_fmadd_ps(in[p], weight, acc[t][p]);
        }
      }
    }
  }
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
#pragma GCC unroll 8
  for (int t = 0; t < TILE; ++t) {
    const int channel = pass.first + t;
    const __m256 bias = _mm256_set1_ps(j.bias ? j.bias[j.first_channel + channel] : 0.0f);
    float* dst = j.out + channel * j.out_stride + x0;
    const float* res = j.residual ? j.residual + channel * j.out_stride + x0 : nullptr;
    for (int p = 0; p < PIXELS; ++p) {
      const int64_t left = j.out_w - x0 - kLanes * p;
      if (left <= 0) break;
      __m256 value = _mm256_add_ps(acc[t][p], bias);
      if (left >= kLanes) {
        if (res) value = _mm256_add_ps(value, _mm256_loadu_ps(res + kLanes * p));
        _mm256_storeu_ps(dst + kLanes * p, value);
      } else {
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)), lane);
        if (res) value = _mm256_add_ps(value, _mm256_maskload_ps(res + kLanes * p, mask));
        _mm256_maskstore_ps(dst + kLanes * p, mask, value);
      }
    }
  }
}

// Whether the PIXELS-vector block at x0 reads only columns inside the input row.
bool interior(const RowJob& j, int64_t x0, int64_t pixels) {
  return x0 - j.pad_x >= 0 && x0 + kLanes * pixels + j.kw - 1 - j.pad_x <= j.in_w;
}

template <int TILE, int PIXELS>
void block_at(const Pass& pass, int64_t x0) {
  const bool inside = interior(pass.job, x0, PIXELS);
  if (pass.job.kw == 3 && pass.job.rows == 3) {
    if (inside) block<TILE, PIXELS, false, 3, 3>(pass, x0);
    else block<TILE, PIXELS, true, 3, 3>(pass, x0);
  } else if (pass.job.kw == 3) {
    if (inside) block<TILE, PIXELS, false, 3, 0>(pass, x0);
    else block<TILE, PIXELS, true, 3, 0>(pass, x0);
  } else {
    if (inside) block<TILE, PIXELS, false, 0, 0>(pass, x0);
    else block<TILE, PIXELS, true, 0, 0>(pass, x0);
  }
}

// TILE * PIXELS accumulators + PIXELS inputs + one weight within the 16 registers.
template <int TILE>
void row(const Pass& pass) {
  constexpr int kPixels = TILE == 4 ? 3 : TILE == 3 ? 3 : TILE == 2 ? 5 : 6;
  constexpr int64_t kWidth = kLanes * kPixels;
  const int64_t out_w = pass.job.out_w;
  int64_t x0 = 0;
  for (; x0 + kWidth <= out_w; x0 += kWidth) block_at<TILE, kPixels>(pass, x0);
  for (; x0 + 2 * kLanes <= out_w; x0 += 2 * kLanes) block_at<TILE, 2>(pass, x0);
  for (; x0 < out_w; x0 += kLanes) block_at<TILE, 1>(pass, x0);
}

void pass_of(const RowJob& job, int first, int tile) {
  const Pass pass{job, first};
  switch (tile) {
    case 1: return row<1>(pass);
    case 2: return row<2>(pass);
    case 3: return row<3>(pass);
    default: return row<4>(pass);
  }
}

}  // namespace

void convolve_row_avx2(const RowJob& job) {
  // Up to 4 channels in one pass; 5 to 8 in two nearly equal ones.
  if (job.tile <= 4) return pass_of(job, 0, job.tile);
  const int half = (job.tile + 1) / 2;
  pass_of(job, 0, half);
  pass_of(job, half, job.tile - half);
}

}  // namespace cubevec::ops::conv_direct
