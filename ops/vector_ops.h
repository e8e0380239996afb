// Vector kernels with MindIE SD's semantics (docs/ops.md, "MindIE SD's vector layers").
// Every op runs on the Vector unit of `stream`'s device, threaded over rows with the unit's
// threads. Inputs may have any strides (an op copies to a contiguous layout on the Vector unit
// when it must). Float inputs are f32 or bf16; the result has the input's dtype; arithmetic is in
// f32. Wrong shapes, layouts, dtypes or names raise cubevec::Error saying what was expected.
#pragma once

#include <string_view>
#include <vector>

#include "ops/op_stream.h"

namespace cubevec::ops {

// MindIE's RMSNorm: y = weight * (x * rsqrt(mean(x^2 over the last dim) + eps)); weight [H] or
// undefined (ones).
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps = 1e-6f, const Stream& stream = default_op_stream());

// RMSNorm over channels several ranks share (tensor parallelism): row_sum_of_squares(x [..., H]) is
// each row's sum of x^2 in f32, [...]; rms_norm_with_sums normalizes x by rsqrt(sums / count + eps)
// with sums [...] f32 (summed over every rank's channels) and count the channels of all ranks, and
// scales by weight [H] (or ones). With x's own sums and count = H it is rms_norm.
Tensor row_sum_of_squares(const Tensor& x, const Stream& stream = default_op_stream());
Tensor rms_norm_with_sums(const Tensor& x, const Tensor& sums, int64_t count, const Tensor& weight, float eps,
                          const Stream& stream = default_op_stream());

// fast_layernorm's impl_mode: 0 high precision, 1 high performance, 2 fp16 (only for f16 x, w, b).
enum class LayerNormImpl { high_precision = 0, high_performance = 1, fp16 = 2 };
struct LayerNormResult {
  Tensor out;   // x's shape and dtype
  Tensor mean;  // f32, x's shape without the last dim
  Tensor rstd;  // f32, 1 / sqrt(var + eps), same shape as mean
};
// LayerNorm over the last dim: (x - mean) * rstd * weight + bias; weight, bias [H] or undefined.
LayerNormResult fast_layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f,
                               LayerNormImpl impl_mode = LayerNormImpl::high_precision, const Stream& stream = default_op_stream());

// AdaLN: out = LayerNorm(x) * (1 + scale) + shift, x [B, S, H]; scale and shift [B, H], [B, 1, H]
// or [B, S, H]; weight, bias [H] or undefined (no affine).
Tensor layernorm_scale_shift(const Tensor& x, const Tensor& scale, const Tensor& shift, const Tensor& weight = {}, const Tensor& bias = {},
                             float eps = 1e-6f, const Stream& stream = default_op_stream());

enum class RotatedMode { rotated_half, rotated_interleaved };
enum class RopeLayout { BSND, BNSD, SBND };             // MindIE: head_first=false is BSND, true is BNSD
RotatedMode parse_rotated_mode(std::string_view name);  // "rotated_half", "rotated_interleaved"
// out = x * cos + rot(x) * sin. x is 4-D in `layout`; cos and sin are full-width [S, D], or 4-D
// [1, S, 1, D] (BSND), [1, 1, S, D] (BNSD), [S, 1, 1, D] (SBND). rotated_half: rot([x1 | x2]) =
// [-x2 | x1]; rotated_interleaved: rot(x)[2i] = -x[2i+1], rot(x)[2i+1] = x[2i].
Tensor rotary_position_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, RotatedMode mode = RotatedMode::rotated_half,
                                 RopeLayout layout = RopeLayout::BSND, const Stream& stream = default_op_stream());

enum class Activation { relu, silu, mish, gelu, gelu_tanh, gelu_fast };
// MindIE's get_activation_layer names, case-insensitive: "swish" and "silu", "mish", "gelu"
// (exact, erf), "relu", "gelu-tanh", "gelu-fast" (x / (1 + exp(-1.702 |x|)) * exp(0.851 (x - |x|))).
Activation get_activation_layer(std::string_view name);
Tensor activation(const Tensor& x, Activation kind, const Stream& stream = default_op_stream());
// The scalar definition of each activation, in double, for reference loops.
double activation_reference(Activation kind, double x);

// Softmax over the last dimension (max-shifted).
Tensor softmax(const Tensor& x, const Stream& stream = default_op_stream());

// torch.nn.functional.group_norm: x [N, C, *], C divisible by num_groups; weight, bias [C] or
// undefined.
Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight = {}, const Tensor& bias = {}, float eps = 1e-5f,
                  const Stream& stream = default_op_stream());
// silu(group_norm(...)) in one pass: the VAE ResNet blocks' norm and nonlinearity, one tensor
// fewer (the SiLU reads the normalized value in f32, before any rounding to x's dtype).
Tensor group_norm_silu(const Tensor& x, int64_t num_groups, const Tensor& weight = {}, const Tensor& bias = {}, float eps = 1e-5f,
                       const Stream& stream = default_op_stream());

// torch.nn.functional.normalize(x, p=2, dim=1, eps) * scale * weight over the channels of a
// channel-first x [N, C, *] (Wan's RMS_norm with scale sqrt(C)): y[n, c, s] = x[n, c, s] /
// max(||x[n, :, s]||_2, eps) * scale * weight[c]; weight [C] or undefined (ones).
Tensor normalize_channels(const Tensor& x, const Tensor& weight, float scale = 1.0f, float eps = 1e-12f,
                          const Stream& stream = default_op_stream());
// silu(normalize_channels(...)) in one pass (the Wan VAE's norm and nonlinearity).
Tensor normalize_channels_silu(const Tensor& x, const Tensor& weight, float scale = 1.0f, float eps = 1e-12f,
                               const Stream& stream = default_op_stream());

// Elementwise arithmetic with NumPy broadcasting; the result has a's dtype (a and b must share it).
Tensor add(const Tensor& a, const Tensor& b, const Stream& stream = default_op_stream());
Tensor sub(const Tensor& a, const Tensor& b, const Stream& stream = default_op_stream());
Tensor mul(const Tensor& a, const Tensor& b, const Stream& stream = default_op_stream());
Tensor div(const Tensor& a, const Tensor& b, const Stream& stream = default_op_stream());
// MindIE's muls_add: x * scale + y, same shapes.
Tensor muls_add(const Tensor& x, const Tensor& y, float scale, const Stream& stream = default_op_stream());

// The parts (same dtype, same sizes except along `dim`) side by side along `dim`; any strides in.
Tensor concat(const std::vector<Tensor>& parts, int64_t dim, const Stream& stream = default_op_stream());

// torch.nn.functional.interpolate(x, scale_factor=scale, mode="nearest") for x [N, C, H, W]:
// out[n, c, y, x] = x[n, c, y / scale, x / scale] (integer division), out [N, C, H*scale, W*scale].
Tensor upsample_nearest2d(const Tensor& x, int64_t scale = 2, const Stream& stream = default_op_stream());

// Casts between f32, bf16 and f16 (round to nearest even); any strides in, contiguous out.
Tensor cast(const Tensor& x, DType to, const Stream& stream = default_op_stream());
// A contiguous copy made on the Vector unit (x itself if already contiguous).
Tensor contiguous(const Tensor& x, const Stream& stream = default_op_stream());

// --- decoder data movement ---------------------------------------------------------------------

// torch.clamp(x, lo, hi) of an f32 tensor (any strides; a NaN stays NaN).
Tensor clamp(const Tensor& x, float lo, float hi, const Stream& stream = default_op_stream());

// [zero_frames zero frames, cache (when defined), x] along time (dim 2) of 5-D f32 tensors with equal
// batch, channel and spatial sizes, in one kernel: a causal 3-D convolution's padded input.
Tensor pad_frames_front(const Tensor& x, const Tensor& cache, int64_t zero_frames, const Stream& stream = default_op_stream());

// diffusers' tiled VAE decode step for one decoded tile [B, C, th, tw] (f32): blends it with its
// upper neighbour `top` over its first `blend` rows and then with its left neighbour `left` over its
// first `blend` columns (either may be undefined), as blend_v and blend_h do, returns the blended
// tile, and copies its first `keep` rows and columns into `out` [B, C, H, W] at (y0, x0).
Tensor blend_tile(const Tensor& tile, const Tensor& top, const Tensor& left, int64_t blend, const Tensor& out, int64_t y0, int64_t x0,
                  int64_t keep, const Stream& stream = default_op_stream());

}  // namespace cubevec::ops
