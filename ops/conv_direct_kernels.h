// The register-tiled inner loops of ops/conv_direct.h. Plain declarations only: the files that
// define them are compiled for AVX-512 and for AVX2 (see ops/gemm/microkernel.h for why nothing inline may be
// shared with it).
#pragma once

#include <cstdint>

namespace cubevec::ops::conv_direct {

// One output row (all its pixels) of `tile` output channels, 1 <= tile <= kMaxTile.
inline constexpr int kMaxTile = 8;
// The widest kernel (its last dimension) the direct kernel takes.
inline constexpr int64_t kMaxKernelWidth = 16;

struct RowJob {
  // The tile's weights, [C][taps][kMaxTile]: a tap is one kernel position (outer offsets, kx); its
  // output channels adjacent, zero past the tile's last (so that one block's weights are one
  // contiguous run, not a line per tap and channel).
  const float* weight_t = nullptr;
  int64_t taps = 0;              // the kernel's volume
  const float* image = nullptr;  // [C][plane]
  int64_t plane = 0;             // floats per input channel
  int64_t channels = 0;          // C
  int64_t first_channel = 0;     // of the tile
  int tile = 0;                  // output channels in the tile
  // The input rows this output row reads: for each, its offset in a channel's plane and its first
  // tap (outer kernel position x kw); rows outside the input (zero padding) are left out.
  const int64_t* row_offsets = nullptr;
  const int64_t* row_taps = nullptr;
  int rows = 0;
  int64_t kw = 0, pad_x = 0, in_w = 0, out_w = 0;
  const float* bias = nullptr;  // [O] or null
  float* out = nullptr;         // the tile's first channel at this row; channels `out_stride` apart
  int64_t out_stride = 0;
  const float* residual = nullptr;  // null, or added as the row is stored: laid out as `out`
};

void convolve_row_avx512(const RowJob& job);
void convolve_row_avx2(const RowJob& job);

}  // namespace cubevec::ops::conv_direct
