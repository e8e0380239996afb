// diffusers' AutoencoderKL, encoder path (the Flux VAE's and any config.json of that class), written
// from diffusers' Encoder, DownEncoderBlock2D, Downsample2D and DiagonalGaussianDistribution (docs/
// models.md, "AutoencoderKL encoder"). Weights keep diffusers' names (`encoder.down_blocks.0.
// downsamplers.0.conv.weight`, `quant_conv.weight`, ...) and load from the same checkpoint as the
// decoder; the blocks shared with the decoder (ResnetBlock2D, the mid block) are vae::'s.
//
// moments() is quant_conv(encoder(x)): [B, 2 latent_channels, H / 8, W / 8], the Gaussian's mean and
// log-variance stacked on channels (diffusers' `latent_dist.parameters`). The pipelines' latents are
// (mean or sample - shift_factor) * scaling_factor; encode() returns the distribution unscaled.
// moments_tiled() is diffusers' tiled encode: overlapping image tiles encoded one by one, their
// latents blended where they overlap, so a large image encodes with memory bounded by the tile.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/autoencoder_kl.h"

namespace cubevec::models {

namespace vae {

// Downsample2D(use_conv, padding=0): one zero row below and one zero column right of x (diffusers'
// F.pad(x, (0, 1, 0, 1))), then the 3x3 stride-2 `conv` (named `<prefix><conv_suffix>`: the Wan
// VAE's downsamplers call it `resample.1`).
struct Downsample2D {
  Conv2d conv;
  void declare(ParameterTable& table, const std::string& prefix, int64_t channels, const std::string& conv_suffix = ".conv");
  Tensor operator()(const Tensor& x, const Stream& stream) const;  // [B, C, H, W] -> [B, C, H / 2, W / 2] (rounded down)
};

// DownEncoderBlock2D: layers_per_block resnets, then (all but the last block) a downsampler.
struct DownEncoderBlock {
  std::vector<ResnetBlock2D> resnets;
  Downsample2D downsampler;  // `downsamplers.0`
  bool has_downsampler = false;

  void declare(ParameterTable& table, const std::string& prefix, int64_t in, int64_t out, int64_t num_resnets, bool add_downsample,
               int64_t groups);
  Tensor operator()(const Tensor& x, const Stream& stream) const;
};

// Every module of the encoder path, named as the checkpoint names them.
struct EncoderModules {
  Conv2d conv_in;                             // `encoder.conv_in`
  std::vector<DownEncoderBlock> down_blocks;  // `encoder.down_blocks.i`
  MidBlock mid_block;                         // `encoder.mid_block`
  GroupNorm conv_norm_out;                    // `encoder.conv_norm_out`, then SiLU
  Conv2d conv_out;                            // `encoder.conv_out` (2 latent_channels: double_z)
  Conv2d quant_conv;                          // `quant_conv` (1x1), when the config uses it
  bool has_quant_conv = false;
};

// diffusers' _tiled_encode over any per-tile encoder. x [B, C, H, W] is cut into tiles of up to
// `tile` x `tile` pixels starting every `step` pixels (0, step, ... while < H, likewise along W);
// encode_tile maps a tile [B, C, th, tw] to [B, C', th / downscale, tw / downscale]. Each encoded
// tile is blended with its already-blended upper and left neighbours over `blend` latent rows and
// columns (vae::decode_in_tiles' blend) and its first `keep` rows and columns are placed in the
// output [B, C', H / downscale, W / downscale] at (i / step * keep, j / step * keep).
Tensor encode_in_tiles(const Tensor& x, int64_t tile, int64_t step, int64_t downscale, int64_t blend, int64_t keep,
                       const std::function<Tensor(const Tensor&)>& encode_tile, const Stream& stream);

}  // namespace vae

// The latent distribution of an image: a diagonal Gaussian (diffusers' DiagonalGaussianDistribution).
struct LatentDistribution {
  Tensor mean;    // [B, latent_channels, h, w] f32
  Tensor logvar;  // the same, clamped to [-30, 20] as diffusers clamps it
  // mean + exp(logvar / 2) * noise, noise f32 of mean's shape (the pipelines' seeded Gaussian noise,
  // pipelines/noise.h: not torch's generator, so not diffusers' draw for the same seed).
  Tensor sample(const Tensor& noise) const;
};

class AutoencoderKLEncoder {
 public:
  // Declares every encoder weight (and quant_conv's when the config uses it); the tensors stay
  // undefined until they are loaded. Throws for a config the encoder cannot be built from.
  explicit AutoencoderKLEncoder(AutoencoderKLConfig config);

  const AutoencoderKLConfig& config() const { return config_; }
  const ParameterTable& parameters() const { return table_; }
  ParameterTable& mutable_parameters() { return table_; }
  const vae::EncoderModules& modules() const { return *modules_; }

  // x [B, in_channels, H, W] f32 or bf16 in [-1, 1] (any strides; H and W multiples of upscale())
  // -> [B, 2 latent_channels, H / upscale, W / upscale] f32.
  Tensor moments(const Tensor& x, const Stream& stream = ops::default_op_stream()) const;
  // diffusers' encode with tiling enabled: an image no larger than sample_size in both dims is
  // encoded whole (exactly moments()); a larger one in sample_size tiles overlapping by 25%.
  Tensor moments_tiled(const Tensor& x, const Stream& stream = ops::default_op_stream()) const;
  // The distribution of moments_tiled(x).
  LatentDistribution encode(const Tensor& x, const Stream& stream = ops::default_op_stream()) const;

 private:
  void check_image(const Tensor& x, const char* what) const;
  AutoencoderKLConfig config_;
  std::unique_ptr<vae::EncoderModules> modules_;  // on the heap: table_'s slots survive a move
  ParameterTable table_;
};

// The distribution held in moments [B, 2C, h, w] (or a video's [B, 2C, T, h, w]): its first C
// channels the mean, the rest the log-variance (clamped).
LatentDistribution latent_distribution(const Tensor& moments, const Stream& stream = ops::default_op_stream());

// A diffusers VAE directory's encoder: dir/config.json plus the weights, stored as `dtype`. Only
// encoder.* and quant_conv.* are loaded; a missing, mis-shaped or unexpected encoder tensor is an
// error listing every such name (a checkpoint saved without its encoder says so).
AutoencoderKLEncoder load_autoencoder_kl_encoder(const std::string& dir, DType dtype = DType::f32, const std::string& variant = "");

}  // namespace cubevec::models
