// diffusers' AutoencoderKLWan, encoder path (WanEncoder3d, WanResample's downsample modes,
// AutoencoderKLWan._encode and tiled_encode), written from docs/models.md, "AutoencoderKLWan
// encoder" and "Wan2.2 VAE". Weights keep diffusers' names
// (`encoder.down_blocks.5.time_conv.weight`, `quant_conv.weight`, ...) and load from the same
// checkpoint as the decoder; the blocks the decoder shares (the causal conv and its feature cache,
// the RMS norm, the residual and mid blocks) are wan_vae::'s, the zero-padded stride-2 conv is
// vae::Downsample2D.
//
// Encoding is causal in time and runs in diffusers' chunks: the first frame alone, then 4 frames at
// a time, each causal conv keeping the last frames of its input from the chunk before. A video of
// 1 + 4k frames gives 1 + k latent frames (Wan2.1: 8x smaller in space, Wan2.2: 16x). moments() is
// quant_conv(encoder(x)), [B, 2 z_dim, T', H/s, W/s] (s = spatial_upscale()): the Gaussian's mean
// and log-variance stacked on channels; encode() returns the distribution unscaled (the pipelines
// normalize it with latents_mean / latents_std, normalize()).
//
// Wan2.2 (patch_size 2, is_residual): each chunk is patchified first (3 -> 12 channels at half the
// height and width, models/wan_vae_regroup.h), and the down blocks are one block per level whose
// output adds the parameter-free shortcut AvgDown3D of its input.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/autoencoder_kl_encoder.h"
#include "models/autoencoder_kl_wan.h"

namespace cubevec::models {

namespace wan_vae {

// WanResample in its encoder modes. downsample2d: per frame, vae::Downsample2D (one zero column
// right and row below, then `resample.1`, a 3x3 stride-2 conv C -> C). downsample3d: then the
// `time_conv` (C -> C, kernel (3, 1, 1), stride 2 in time, no padding) over [the previous chunk's
// last frame, this chunk's frames]; the video's first chunk passes through it unchanged. The cache
// slot holds that last frame (undefined before the first chunk).
struct Downsample {
  bool temporal = false;
  vae::Downsample2D spatial;
  Tensor time_weight, time_bias;  // [C, C, 3, 1, 1], [C]
  int slot = -1;

  void declare(ParameterTable& table, const std::string& prefix, int64_t channels, bool downsample_time, int& slots);
  Tensor operator()(const Tensor& x, FeatureCache& cache, const Stream& stream) const;  // [B, C, T, H, W] -> [B, C, T', H/2, W/2]
};

// One entry of the encoder's flat `down_blocks` list: a residual block or a downsampler.
struct DownLayer {
  bool is_downsample = false;
  ResidualBlock residual;
  Downsample downsample;
};

// WanResidualDownBlock (is_residual): `resnets.j` (in -> out first), then (all but the last level)
// `downsampler`, plus the shortcut AvgDown3D(in, out, 2 when temporal else 1, 2 when downsampling
// else 1) of the block's input, per chunk and without a cache (the last level's is the identity).
struct ResidualDownBlock {
  std::vector<ResidualBlock> resnets;
  Downsample downsampler;
  bool has_downsampler = false;
  int64_t out = 0, time_factor = 1, space_factor = 1;

  void declare(ParameterTable& table, const std::string& prefix, int64_t in, int64_t out_channels, int64_t num_resnets, bool downsample,
               bool temporal, int& slots);
  Tensor operator()(const Tensor& x, FeatureCache& cache, const Stream& stream) const;
};

// Every module of the encoder path, named as the checkpoint names them.
struct EncoderModules {
  CausalConv3d conv_in;                                 // `encoder.conv_in`
  std::vector<DownLayer> down_blocks;                   // `encoder.down_blocks.k` (Wan2.1; empty with is_residual)
  std::vector<ResidualDownBlock> residual_down_blocks;  // `encoder.down_blocks.i` (is_residual)
  MidBlock mid_block;                                   // `encoder.mid_block`
  RMSNorm norm_out;                                     // `encoder.norm_out`, then SiLU
  CausalConv3d conv_out;                                // `encoder.conv_out` (2 z_dim)
  CausalConv3d quant_conv;                              // `quant_conv` (1x1x1, 2 z_dim -> 2 z_dim)
  int cache_slots = 0;
};

}  // namespace wan_vae

struct WanEncodeOptions {
  // diffusers' enable_tiling(): tiles of tile_sample_min pixels every tile_sample_stride, used when
  // the video is larger than one tile (diffusers' defaults 256 and 192). Off by default, as in
  // diffusers; the result differs from the whole encode where tiles meet. Refused with
  // patch_size > 1 (diffusers' tiled encode of a patchified video is not ported).
  bool tiling = false;
  int64_t tile_sample_min = 256;
  int64_t tile_sample_stride = 192;
};

class AutoencoderKLWanEncoder {
 public:
  // Declares every encoder weight and quant_conv's; the tensors stay undefined until they are
  // loaded. Throws for a config the encoder cannot be built from (attn_scales other than [], which
  // diffusers' encoder cannot run either).
  explicit AutoencoderKLWanEncoder(AutoencoderKLWanConfig config);

  const AutoencoderKLWanConfig& config() const { return config_; }
  const ParameterTable& parameters() const { return table_; }
  ParameterTable& mutable_parameters() { return table_; }
  const wan_vae::EncoderModules& modules() const { return *modules_; }

  // x [B, encoder_video_channels() (3), 1 + 4k, H, W] f32 or bf16 in [-1, 1] (any strides; H and W
  // positive multiples of s = spatial_upscale()) -> [B, 2 z_dim, 1 + k (for Wan2.1 and 2.2), H/s, W/s]
  // f32, in diffusers' chunks (each patchified when patch_size > 1) with the host paced step by
  // step (memory bounded by one chunk).
  Tensor moments(const Tensor& x, const WanEncodeOptions& options = {}, const Stream& stream = ops::default_op_stream()) const;
  // The distribution of moments(x).
  LatentDistribution encode(const Tensor& x, const WanEncodeOptions& options = {}, const Stream& stream = ops::default_op_stream()) const;
  // The pipelines' normalization of a latent (its mean or a sample) [B, z_dim, T, h, w], as
  // WanImageToVideoPipeline computes it in f32: (latents - latents_mean) * (1 / latents_std).
  Tensor normalize(const Tensor& latents, const Stream& stream = ops::default_op_stream()) const;
  // An upper estimate of the allocator's peak while encoding a batch of `batch` videos of H x W: the
  // feature caches (2 frames per causal conv) and a chunk's working set (about 6 of its widest
  // activations: 4 frames x base_dim channels at the encoder's full resolution, H/p x W/p with
  // patch_size p; with is_residual 2 more for the kept block input and its AvgDown3D copy), f32.
  uint64_t estimate_peak_bytes(int64_t batch, int64_t height, int64_t width) const;
  // The latent frame count for `frames` video frames (1 + 4k), or an error naming what fits.
  int64_t latent_frames(int64_t frames) const;

 private:
  Tensor moments_whole(const Tensor& x, const Stream& stream) const;
  AutoencoderKLWanConfig config_;
  std::unique_ptr<wan_vae::EncoderModules> modules_;  // on the heap: table_'s slots survive a move
  ParameterTable table_;
};

// A diffusers AutoencoderKLWan directory's encoder: dir/config.json plus the weights, stored as
// `dtype`. Only encoder.* and quant_conv.* are loaded; a missing, mis-shaped or unexpected encoder
// tensor is an error listing every such name (a checkpoint saved without its encoder says so).
AutoencoderKLWanEncoder load_autoencoder_kl_wan_encoder(const std::string& dir, DType dtype = DType::f32, const std::string& variant = "");

}  // namespace cubevec::models
