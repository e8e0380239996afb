#include "ops/conv_direct.h"

#include <algorithm>
#include <string>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "ops/conv_direct_kernels.h"
#include "ops/gemm/driver.h"
#include "base/error.h"

namespace cubevec::ops::conv_direct {

int64_t max_output_channels(Isa isa) { return isa == Isa::avx2 ? 128 : 64; }

bool available() { return gemm::best_isa() == Isa::avx512 || gemm::best_isa() == Isa::avx2; }

template <int D>
void convolve(const float* image, const float* weight, const float* bias, float* out, const Shape<D>& shape, const float* residual) {
  convolve<D>(image, weight, bias, out, shape, gemm::best_isa(), residual);
}

template <int D>
void convolve(const float* image, const float* weight, const float* bias, float* out, const Shape<D>& s, Isa isa, const float* residual) {
  if (isa != Isa::avx512 && isa != Isa::avx2)
    throw Error("conv_direct::convolve: no direct kernel for ISA " + std::string(isa_name(isa)) + " (expected avx512 or avx2)");
  if (!isa_supported(isa)) throw Error("conv_direct::convolve: this CPU does not run " + std::string(isa_name(isa)));
  void (*const convolve_row)(const RowJob&) = isa == Isa::avx512 ? convolve_row_avx512 : convolve_row_avx2;
  constexpr int L = D - 1;  // the contiguous dimension
  int64_t taps = 1, in_plane = 1, out_plane = 1;
  for (int d = 0; d < D; ++d) taps *= s.kernel[d], in_plane *= s.in[d], out_plane *= s.out[d];
  const int64_t kw = s.kernel[L], outer_taps = taps / kw, out_rows = out_plane / s.out[L];
  // [O][C][taps] -> [tile][C][taps][kMaxTile], so that a tile's weights for one tap are adjacent
  // and a tile's whole set is one contiguous run (zeros past O in the last tile).
  const int64_t tiles = (s.o + kMaxTile - 1) / kMaxTile, tile_floats = s.c * taps * kMaxTile;
  std::vector<float> weight_t(static_cast<std::size_t>(tiles * tile_floats), 0.0f);
  for (int64_t o = 0; o < s.o; ++o)
    for (int64_t ct = 0; ct < s.c * taps; ++ct)
      weight_t[static_cast<std::size_t>((o / kMaxTile) * tile_floats + ct * kMaxTile + o % kMaxTile)] = weight[o * s.c * taps + ct];
  RowJob shared;  // what every row's job has in common
  shared.taps = taps;
  shared.image = image;
  shared.plane = in_plane;
  shared.channels = s.c;
  shared.kw = kw;
  shared.pad_x = s.padding[L];
  shared.in_w = s.in[L];
  shared.out_w = s.out[L];
  shared.bias = bias;
  shared.out_stride = out_plane;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, out_rows * tiles), [&](const tbb::blocked_range<int64_t>& range) {
    std::vector<int64_t> offsets, first_taps;  // the input rows of one output row (reused along the range)
    for (int64_t job_index = range.begin(); job_index < range.end(); ++job_index) {
      const int64_t out_row = job_index / tiles, tile = job_index % tiles;
      // The output row's outer coordinates, then the input rows each outer kernel position reads.
      std::array<int64_t, D> at{};
      for (int64_t d = L - 1, rest = out_row; d >= 0; --d) at[d] = rest % s.out[d], rest /= s.out[d];
      offsets.clear();
      first_taps.clear();
      for (int64_t k = 0; k < outer_taps; ++k) {
        int64_t offset = 0;
        bool inside = true;
        for (int64_t d = 0, rest = k, stride = outer_taps; d < L; ++d) {
          stride /= s.kernel[d];
          const int64_t kd = rest / stride;
          rest %= stride;
          const int64_t coord = at[d] + kd - s.padding[d];
          inside = inside && coord >= 0 && coord < s.in[d];
          offset = offset * s.in[d] + coord;
        }
        if (!inside) continue;
        offsets.push_back(offset * s.in[L]);
        first_taps.push_back(k * kw);
      }
      RowJob j = shared;
      j.first_channel = tile * kMaxTile;
      j.weight_t = weight_t.data() + tile * tile_floats;
      j.tile = static_cast<int>(std::min<int64_t>(kMaxTile, s.o - j.first_channel));
      j.row_offsets = offsets.data();
      j.row_taps = first_taps.data();
      j.rows = static_cast<int>(offsets.size());
      j.out = out + j.first_channel * out_plane + out_row * s.out[L];
      if (residual) j.residual = residual + j.first_channel * out_plane + out_row * s.out[L];
      convolve_row(j);
    }
  });
}

template void convolve<2>(const float*, const float*, const float*, float*, const Shape<2>&, const float*);
template void convolve<3>(const float*, const float*, const float*, float*, const Shape<3>&, const float*);
template void convolve<2>(const float*, const float*, const float*, float*, const Shape<2>&, Isa, const float*);
template void convolve<3>(const float*, const float*, const float*, float*, const Shape<3>&, Isa, const float*);

}  // namespace cubevec::ops::conv_direct
