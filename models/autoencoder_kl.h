// diffusers' AutoencoderKL, decoder path only (the Flux VAE and any config.json of that class),
// written from docs/models.md, "AutoencoderKL decoder". Weights keep diffusers' names
// (`decoder.up_blocks.2.resnets.0.conv_shortcut.weight`, `post_quant_conv.weight`, ...); each block
// is a plain sequence of fused-op calls (group_norm, activation, conv2d, linear, attention_forward,
// upsample_nearest2d, add).
//
// decode() takes the latent already unscaled by the pipeline (Flux: z = latents / scaling_factor +
// shift_factor) and returns the image in roughly [-1, 1], unclamped. decode_tiled() is diffusers'
// tiled_decode: overlapping latent tiles decoded one by one and blended linearly where they
// overlap, so a large image decodes with memory bounded by the tile size.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/layers.h"
#include "models/vae_split.h"

namespace cubevec::models {

struct AutoencoderKLConfig {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  int64_t latent_channels = 4;
  std::vector<int64_t> block_out_channels{64};
  int64_t layers_per_block = 1;
  int64_t norm_num_groups = 32;
  int64_t sample_size = 32;  // a list in config.json counts by its first entry, as in diffusers
  double scaling_factor = 0.18215;
  double shift_factor = 0.0;  // null in config.json means 0
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;
  std::string act_fn = "silu";  // the only one supported

  // Image pixels per latent pixel: 2^(len(block_out_channels) - 1) (8 for Flux).
  int64_t upscale() const { return int64_t{1} << (block_out_channels.size() - 1); }
  // diffusers' tile_latent_min_size: int(sample_size / upscale) (128 for Flux).
  int64_t tile_latent_size() const { return sample_size / upscale(); }

  // From a diffusers vae/config.json. Required: out_channels, latent_channels, block_out_channels,
  // layers_per_block, norm_num_groups, scaling_factor; every other key defaults to diffusers' code
  // default. Keys starting with '_' and force_upcast, latents_mean, latents_std are accepted;
  // down_block_types must list DownEncoderBlock2D once per block_out_channels entry; anything else, a missing required key, a wrong type or
  // an unsupported value is an error naming `source` and the key.
  static AutoencoderKLConfig from_json(const nlohmann::json& json, const std::string& source);
  static AutoencoderKLConfig load(const std::string& config_path);
  // The FLUX.1 VAE: 16 latent channels, [128, 256, 512, 512], no quant convs, 0.3611 / 0.1159.
  static AutoencoderKLConfig flux();
};

// Throws naming `source` and the key for a config neither the decoder nor the encoder can be built from.
void validate_autoencoder_kl_config(const AutoencoderKLConfig& config, const std::string& source);

namespace vae {

// GroupNorm(groups, C, eps, affine): `<name>.weight`, `<name>.bias` [C]; optionally SiLU after.
struct GroupNorm {
  Vector1d weight, bias;
  int64_t groups = 32;
  float eps = 1e-6f;

  void declare(ParameterTable& table, const std::string& name, int64_t channels, int64_t num_groups);
  Tensor operator()(const Tensor& x, const Stream& stream, bool silu = false) const;
};

// ResnetBlock2D without a time embedding: out = shortcut(x) + conv2(SiLU(GN2(conv1(SiLU(GN1(x)))))),
// shortcut the 1x1 `conv_shortcut` when in != out channels, else the identity.
struct ResnetBlock2D {
  GroupNorm norm1, norm2;
  Conv2d conv1, conv2, conv_shortcut;
  bool has_shortcut = false;

  void declare(ParameterTable& table, const std::string& prefix, int64_t in, int64_t out, int64_t groups);
  Tensor operator()(const Tensor& x, const Stream& stream) const;  // [B, in, H, W] -> [B, out, H, W]
};

// The mid block's single-head self-attention over the H*W positions: out = x + to_out.0(
// softmax(q k^T / sqrt(C)) v) with q, k, v = to_q, to_k, to_v of GroupNorm(x) as [B, HW, C] tokens.
struct Attention {
  GroupNorm group_norm;
  Linear to_q, to_k, to_v, to_out;  // to_out is `to_out.0`
  int64_t channels = 0;

  void declare(ParameterTable& table, const std::string& prefix, int64_t num_channels, int64_t groups);
  Tensor operator()(const Tensor& x, const Stream& stream) const;  // [B, C, H, W] -> same
};

// Upsample2D(use_conv): nearest-neighbour 2x, then the 3x3 pad-1 `conv`.
struct Upsample2D {
  Conv2d conv;
  void declare(ParameterTable& table, const std::string& prefix, int64_t channels);
  Tensor operator()(const Tensor& x, const Stream& stream) const;
};

// UNetMidBlock2D: resnets.0 -> attentions.0 (when added) -> resnets.1.
struct MidBlock {
  ResnetBlock2D resnet0, resnet1;
  Attention attention;
  bool has_attention = true;

  void declare(ParameterTable& table, const std::string& prefix, int64_t channels, int64_t groups, bool add_attention);
  Tensor operator()(const Tensor& x, const Stream& stream) const;
};

// UpDecoderBlock2D: layers_per_block + 1 resnets, then (all but the last block) an upsampler.
struct UpDecoderBlock {
  std::vector<ResnetBlock2D> resnets;
  Upsample2D upsampler;  // `upsamplers.0`
  bool has_upsampler = false;

  void declare(ParameterTable& table, const std::string& prefix, int64_t in, int64_t out, int64_t num_resnets, bool add_upsample,
               int64_t groups);
  Tensor operator()(const Tensor& x, const Stream& stream) const;
};

// Every module of the decoder path, named as the checkpoint names them.
struct DecoderModules {
  Conv2d post_quant_conv;  // `post_quant_conv` (1x1), when the config uses it
  bool has_post_quant_conv = false;
  Conv2d conv_in;                         // `decoder.conv_in`
  MidBlock mid_block;                     // `decoder.mid_block`
  std::vector<UpDecoderBlock> up_blocks;  // `decoder.up_blocks.i`
  GroupNorm conv_norm_out;                // `decoder.conv_norm_out`, then SiLU
  Conv2d conv_out;                        // `decoder.conv_out`
};

// diffusers' tiled_decode over any per-tile decoder (the decoder's own, or a synthetic one in
// tests). z [B, C, H, W] is cut into tiles of up to `tile` x `tile` latent pixels starting every
// tile - overlap pixels (0, stride, 2 stride, ... while < H, likewise along W); decode_tile maps a
// tile [B, C, th, tw] to [B, C', upscale th, upscale tw]. Each decoded tile is blended, in place, with
// its already-blended upper neighbour over its first min(upper rows, its rows, upscale overlap) rows
// (weights 1 - y/e for the neighbour's last e rows, y/e for its own) and then with its left
// neighbour likewise over columns; its first upscale (tile - overlap) rows and columns are placed in
// the output [B, C', upscale H, upscale W]. Only the previous row of decoded tiles is kept.
Tensor decode_in_tiles(const Tensor& z, int64_t tile, int64_t overlap, int64_t upscale,
                       const std::function<Tensor(const Tensor&)>& decode_tile, const Stream& stream);

}  // namespace vae

struct TileOptions {
  // Latent rows / columns per tile; 0: the config's tile_latent_size() (diffusers' 128 for Flux).
  int64_t tile_latent_size = 0;
  // Latent rows / columns neighbouring tiles share; -1: diffusers' 25%, tile - floor(0.75 tile)
  // (32 for Flux). The image-space blend extent is upscale() times this.
  int64_t overlap_latent = -1;
  // Patch parallel: tile k is decoded by rank k mod ranks() and shared with every rank before the
  // blend, so each rank returns the whole image. Null: one device decodes every tile.
  const TileSharing* sharing = nullptr;
};

class AutoencoderKLDecoder {
 public:
  // Declares every decoder weight (and post_quant_conv's when the config uses it); the tensors
  // stay undefined until load_parameters / make_random_parameters / make_meta_parameters fills
  // parameters(). Throws for a config the decoder cannot be built from.
  explicit AutoencoderKLDecoder(AutoencoderKLConfig config);

  const AutoencoderKLConfig& config() const { return config_; }
  const ParameterTable& parameters() const { return table_; }
  ParameterTable& mutable_parameters() { return table_; }
  const vae::DecoderModules& modules() const { return *modules_; }

  // z [B, latent_channels, h, w] f32 or bf16 (any strides), already unscaled -> the image
  // [B, out_channels, upscale h, upscale w] f32, unclamped.
  Tensor decode(const Tensor& z, const Stream& stream = ops::default_op_stream()) const;
  // diffusers' decode with tiling enabled: a latent no larger than one tile in both dims is decoded
  // whole (exactly decode()); a larger one goes through vae::decode_in_tiles with this decoder.
  Tensor decode_tiled(const Tensor& z, const TileOptions& options = {}, const Stream& stream = ops::default_op_stream()) const;
  // The tiles decode_tiled cuts a latent of h x w into with the default options (1: decoded whole).
  int64_t tile_count(int64_t latent_h, int64_t latent_w) const;

 private:
  AutoencoderKLConfig config_;
  std::unique_ptr<vae::DecoderModules> modules_;  // on the heap: table_'s slots survive a move
  ParameterTable table_;
};

// A diffusers VAE directory: dir/config.json plus the weights (one .safetensors file or a sharded
// index), stored as `dtype` (f32 or bf16). Only decoder.* and post_quant_conv.* are loaded; the
// encoder's tensors (encoder.*, quant_conv.*) are ignored. A missing, mis-shaped or unexpected
// decoder tensor is an error listing every such name.
AutoencoderKLDecoder load_autoencoder_kl(const std::string& dir, DType dtype = DType::f32, const std::string& variant = "");

}  // namespace cubevec::models
