// The parameter-free regroupings of the Wan2.2 VAE (AutoencoderKLWan with patch_size > 1 and
// is_residual), shared by its encoder and decoder: each moves pixels between the spatial or time
// positions and the channels of a 5-D f32 activation [B, C, T, H, W], as one strided copy (plus a
// sum for AvgDown3D). docs/models.md, "Wan2.2 VAE", gives the per-element formulas.
#pragma once

#include <cstdint>

#include "device/stream.h"
#include "ops/op_stream.h"
#include "tensor/tensor.h"

namespace cubevec::models::wan_vae {

// x [B, C, T, H, W] -> [B, C p^2, T, H/p, W/p]: channel c p^2 + dx p + dy holds x[c, t, i p + dy,
// j p + dx] (dx the width offset, then dy the height offset). H and W multiples of p.
Tensor patchify(const Tensor& x, int64_t p, const Stream& stream = ops::default_op_stream());
// Its inverse: [B, C p^2, T, h, w] -> [B, C, T, h p, w p].
Tensor unpatchify(const Tensor& x, int64_t p, const Stream& stream = ops::default_op_stream());

// AvgDown3D(C, out, ft, fs), the residual down block's shortcut: zero frames in front up to a
// multiple of ft, each (ft, fs, fs) cell's positions moved into the channels (channel major, then
// the time, height and width offsets), then the mean of each run of C ft fs^2 / out consecutive
// channels: [B, C, T, H, W] -> [B, out, ceil(T / ft), H/fs, W/fs]. The identity when nothing moves.
Tensor avg_down_3d(const Tensor& x, int64_t out, int64_t ft, int64_t fs, const Stream& stream = ops::default_op_stream());
// DupUp3D(C, out, ft, fs), the residual up block's shortcut: each channel repeated out ft fs^2 / C
// times, read as (out channel, time, height, width offset) and spread over the cells: [B, C, T, H, W]
// -> [B, out, T ft, H fs, W fs]; first_chunk drops the first ft - 1 frames (the chunk holding the
// video's first latent frame, which the temporal upsampler passes through alone).
Tensor dup_up_3d(const Tensor& x, int64_t out, int64_t ft, int64_t fs, bool first_chunk, const Stream& stream = ops::default_op_stream());

}  // namespace cubevec::models::wan_vae
