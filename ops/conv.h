// Convolutions on the Cube unit as im2col + GEMM, or for few output channels a direct kernel:
// conv2d (VAE) and conv3d (Wan's patch embedding and causal VAE). NCHW / NCTHW layouts, f32,
// groups = 1; the weight is PyTorch's [O, C, kernel...]. The im2col buffer is built in blocks of
// output positions, so memory stays bounded for large images.
#pragma once

#include <array>

#include "ops/gemm.h"

namespace cubevec::ops {

template <int D>
struct ConvOptions {
  std::array<int64_t, D> stride;
  std::array<int64_t, D> padding;  // zeros on both sides of each spatial dim
  std::array<int64_t, D> dilation;
  GemmBackend backend = GemmBackend::cubevec;
  // The register-tiled direct kernel where it applies (ops/conv_direct.h: few output channels,
  // unit stride and dilation, AVX-512); false: always im2col + GEMM (benchmarks compare the two).
  bool direct = true;
  // The dtype the modelled NPU runs it in (the activations'), for the cost model; the CPU computes in f32.
  DType priced_as = DType::f32;

  ConvOptions() {
    stride.fill(1);
    padding.fill(0);
    dilation.fill(1);
  }
};
using Conv2dOptions = ConvOptions<2>;
using Conv3dOptions = ConvOptions<3>;

// x [N, C, H, W], weight [O, C, kh, kw], bias [O] or undefined -> [N, O, Ho, Wo].
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, const Conv2dOptions& options = {},
              const Stream& stream = default_op_stream());
// conv2d(x, weight, bias) + residual in one kernel, the residual added as the output is stored
// (the VAE ResNet block's second convolution and skip connection: no separate add, no extra
// tensor). residual: f32, contiguous, the output's shape [N, O, Ho, Wo].
Tensor conv2d_add(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual, const Conv2dOptions& options = {},
                  const Stream& stream = default_op_stream());
// x [N, C, T, H, W], weight [O, C, kt, kh, kw], bias [O] or undefined -> [N, O, To, Ho, Wo].
Tensor conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, const Conv3dOptions& options = {},
              const Stream& stream = default_op_stream());
// conv3d(x, weight, bias) + residual in one kernel, as conv2d_add (the Wan VAE residual block's
// second causal convolution and its skip). residual: f32, contiguous, [N, O, To, Ho, Wo].
Tensor conv3d_add(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual, const Conv3dOptions& options = {},
                  const Stream& stream = default_op_stream());

}  // namespace cubevec::ops
