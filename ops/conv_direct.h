// Direct convolution for few output channels (ops/conv.cpp): the VAE decoders' convolutions at
// full resolution have 3 to 64 channels, where im2col + GEMM moves each input value through memory
// three times (the 9x or 27x im2col copy, the GEMM's packing of it, the kernel) for only 2 x O
// flops, and runs at a quarter of the FMA peak. This kernel keeps a tile of output channels x
// pixels in registers and reads the input once per kernel offset.
//
// Stride 1 and dilation 1 in every dimension, kernels up to 16 wide in the last dimension, any
// padding; f32; AVX-512 or AVX2 + FMA (elsewhere conv.cpp keeps im2col + GEMM).
#pragma once

#include <array>
#include <cstdint>

#include "ops/isa.h"

namespace cubevec::ops::conv_direct {

// The most output channels for which the direct kernel is used: above it the GEMM has enough rows
// to amortize its packing. Measured per kernel (docs/performance.md, "VAE convolutions"): AVX-512
// 64 on a Xeon; AVX2 128 on a Zen 3 (1.1-1.5x im2col + GEMM at 96 and 128, even at 192, 0.9x at 256).
int64_t max_output_channels(Isa isa);

// One image's convolution, D = 2 or 3 spatial dimensions (the last contiguous).
template <int D>
struct Shape {
  int64_t c = 0, o = 0;
  std::array<int64_t, D> in{}, kernel{}, out{}, padding{};
};

// Whether the kernel is used: the GEMM's ISA choice (gemm::best_isa, CUBEVEC_GEMM_ISA) is AVX-512
// or AVX2, each of which has a kernel here.
bool available();

// out [O, out volume] = weight [O, C, kernel...] * image [C, in volume] (+ bias [O] if not null)
// (+ residual [O, out volume] if not null, added as each row is stored), with the kernel of the
// GEMM's ISA choice, or of `isa` (avx512 or avx2; an error if this CPU does not run it). Parallel
// over output rows and channel tiles in the calling arena.
template <int D>
void convolve(const float* image, const float* weight, const float* bias, float* out, const Shape<D>& shape,
              const float* residual = nullptr);
template <int D>
void convolve(const float* image, const float* weight, const float* bias, float* out, const Shape<D>& shape, Isa isa,
              const float* residual = nullptr);

}  // namespace cubevec::ops::conv_direct
