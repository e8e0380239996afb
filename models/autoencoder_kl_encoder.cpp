#include "models/autoencoder_kl_encoder.h"

#include <algorithm>
#include <cmath>

#include "models/component.h"
#include "ops/vector_ops.h"
#include "base/error.h"

namespace cubevec::models {

namespace vae {

void Downsample2D::declare(ParameterTable& table, const std::string& prefix, int64_t channels, const std::string& conv_suffix) {
  conv.declare(table, prefix + conv_suffix, channels, channels, 3, /*conv_stride=*/2, /*conv_padding=*/0);
}

Tensor Downsample2D::operator()(const Tensor& x, const Stream& stream) const {
  // diffusers pads one zero column on the right and one zero row at the bottom only: a symmetric
  // padding would move every stride-2 window up and left by one pixel.
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const Tensor column = Tensor::zeros({b, c, h, 1}, x.dtype()), row = Tensor::zeros({b, c, 1, w + 1}, x.dtype());
  const Tensor padded = ops::concat({ops::concat({x, column}, 3, stream), row}, 2, stream);
  return conv(padded, stream);
}

void DownEncoderBlock::declare(ParameterTable& table, const std::string& prefix, int64_t in, int64_t out, int64_t num_resnets,
                               bool add_downsample, int64_t groups) {
  resnets.resize(static_cast<std::size_t>(num_resnets));
  for (std::size_t j = 0; j < resnets.size(); ++j)
    resnets[j].declare(table, prefix + ".resnets." + std::to_string(j), j == 0 ? in : out, out, groups);
  has_downsampler = add_downsample;
  if (has_downsampler) downsampler.declare(table, prefix + ".downsamplers.0", out);
}

Tensor DownEncoderBlock::operator()(const Tensor& x, const Stream& stream) const {
  Tensor h = x;
  for (const ResnetBlock2D& resnet : resnets) h = resnet(h, stream);
  return has_downsampler ? downsampler(h, stream) : h;
}

Tensor encode_in_tiles(const Tensor& x, int64_t tile, int64_t step, int64_t downscale, int64_t blend, int64_t keep,
                       const std::function<Tensor(const Tensor&)>& encode_tile, const Stream& stream) {
  if (!x.defined() || x.dim() != 4 || x.size(2) < 1 || x.size(3) < 1)
    throw Error("encode_in_tiles: x must be [B, C, H, W] with H, W >= 1, got " +
                (x.defined() ? shape_to_string(x.shape()) : std::string("an undefined tensor")));
  if (tile < 1 || step < 1 || step > tile || downscale < 1 || blend < 0 || keep < 1)
    throw Error("encode_in_tiles: need tile >= step >= 1, downscale >= 1, blend >= 0 and keep >= 1, got tile " + std::to_string(tile) +
                ", step " + std::to_string(step) + ", downscale " + std::to_string(downscale) + ", blend " + std::to_string(blend) +
                ", keep " + std::to_string(keep));
  if (!encode_tile) throw Error("encode_in_tiles: no tile encoder given");
  const int64_t batch = x.size(0), height = x.size(2), width = x.size(3);
  // The output's size: each tile row (column) contributes its first `keep` latent rows (columns), or
  // all of a last, shorter tile's, as diffusers' concatenation of the cropped tiles.
  const auto extent = [&](int64_t size) {
    int64_t total = 0;
    for (int64_t i = 0; i < size; i += step) total += std::min(keep, std::min(tile, size - i) / downscale);
    return total;
  };
  const int64_t out_h = extent(height), out_w = extent(width);
  Tensor out;
  std::vector<Tensor> above, current;  // the blended tiles of the previous and the current row
  for (int64_t i = 0, y0 = 0; i < height; i += step) {
    current.clear();
    const int64_t th = std::min(tile, height - i);
    for (int64_t j = 0, x0 = 0; j < width; j += step) {
      const int64_t tw = std::min(tile, width - j);
      Tensor encoded = encode_tile(x.narrow(2, i, th).narrow(3, j, tw));
      const int64_t channels = out.defined() ? out.size(1) : (encoded.defined() && encoded.dim() == 4 ? encoded.size(1) : -1);
      const Shape want = {batch, channels, th / downscale, tw / downscale};
      if (!encoded.defined() || encoded.dtype() != DType::f32 || encoded.shape() != want)
        throw Error("encode_in_tiles: the tile encoder must return f32 " + shape_to_string(want) + " for the tile at (" +
                    std::to_string(i) + ", " + std::to_string(j) + "), got " +
                    (encoded.defined() ? encoded.describe() : std::string("an undefined tensor")));
      if (!encoded.is_contiguous()) encoded = ops::contiguous(encoded, stream);
      if (!out.defined()) out = stream.device().empty({batch, channels, out_h, out_w}, DType::f32, stream);
      const std::size_t col = current.size();
      current.push_back(
          ops::blend_tile(encoded, i > 0 ? above[col] : Tensor(), col > 0 ? current[col - 1] : Tensor(), blend, out, y0, x0, keep, stream));
      x0 += std::min(keep, tw / downscale);
    }
    y0 += std::min(keep, th / downscale);
    above.swap(current);
  }
  return out;
}

}  // namespace vae

// --- the distribution ---------------------------------------------------------------------------

LatentDistribution latent_distribution(const Tensor& moments, const Stream& stream) {
  if (!moments.defined() || (moments.dim() != 4 && moments.dim() != 5) || moments.size(1) % 2 != 0 || moments.size(1) < 2)
    throw Error("latent_distribution: moments must be [B, 2C, h, w] or [B, 2C, T, h, w], got " +
                (moments.defined() ? shape_to_string(moments.shape()) : std::string("an undefined tensor")));
  const int64_t c = moments.size(1) / 2;
  const Tensor f32 = moments.dtype() == DType::f32 ? moments : ops::cast(moments, DType::f32, stream);
  return {ops::contiguous(f32.narrow(1, 0, c), stream), ops::clamp(ops::contiguous(f32.narrow(1, c, c), stream), -30.0f, 20.0f, stream)};
}

Tensor LatentDistribution::sample(const Tensor& noise) const {
  if (!noise.defined() || noise.dtype() != DType::f32 || noise.shape() != mean.shape())
    throw Error("LatentDistribution::sample: the noise must be f32 " + shape_to_string(mean.shape()) + ", got " +
                (noise.defined() ? noise.describe() : std::string("an undefined tensor")));
  const Tensor m = mean.contiguous(), lv = logvar.contiguous(), n = noise.contiguous();
  Tensor out = Tensor::empty(mean.shape(), DType::f32);
  const float *pm = m.data<float>(), *pl = lv.data<float>(), *pn = n.data<float>();
  float* po = out.mutable_data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) po[i] = pm[i] + std::exp(0.5f * pl[i]) * pn[i];
  return out;
}

// --- the encoder --------------------------------------------------------------------------------

AutoencoderKLEncoder::AutoencoderKLEncoder(AutoencoderKLConfig config)
    : config_(std::move(config)), modules_(std::make_unique<vae::EncoderModules>()) {
  validate_autoencoder_kl_config(config_, "AutoencoderKLEncoder");
  vae::EncoderModules& m = *modules_;
  const std::vector<int64_t>& channels = config_.block_out_channels;
  const int64_t groups = config_.norm_num_groups, moments = 2 * config_.latent_channels;
  m.conv_in.declare(table_, "encoder.conv_in", config_.in_channels, channels.front(), 3, 1, 1);
  m.down_blocks.resize(channels.size());
  int64_t previous = channels.front();
  for (std::size_t i = 0; i < channels.size(); ++i) {
    m.down_blocks[i].declare(table_, "encoder.down_blocks." + std::to_string(i), previous, channels[i], config_.layers_per_block,
                             i + 1 < channels.size(), groups);
    previous = channels[i];
  }
  m.mid_block.declare(table_, "encoder.mid_block", channels.back(), groups, config_.mid_block_add_attention);
  m.conv_norm_out.declare(table_, "encoder.conv_norm_out", channels.back(), groups);
  m.conv_out.declare(table_, "encoder.conv_out", channels.back(), moments, 3, 1, 1);
  m.has_quant_conv = config_.use_quant_conv;
  if (m.has_quant_conv) m.quant_conv.declare(table_, "quant_conv", moments, moments, 1);
}

void AutoencoderKLEncoder::check_image(const Tensor& x, const char* what) const {
  const int64_t scale = config_.upscale();
  if (!x.defined() || x.dim() != 4 || x.size(1) != config_.in_channels || (x.dtype() != DType::f32 && x.dtype() != DType::bf16) ||
      x.size(0) < 1 || x.size(2) < scale || x.size(3) < scale || x.size(2) % scale != 0 || x.size(3) % scale != 0)
    throw Error(std::string("AutoencoderKL ") + what + ": the image must be f32 or bf16 [B, " + std::to_string(config_.in_channels) +
                ", H, W] with H and W positive multiples of " + std::to_string(scale) + ", got " +
                (x.defined() ? x.describe() : std::string("an undefined tensor")));
}

Tensor AutoencoderKLEncoder::moments(const Tensor& x, const Stream& stream) const {
  check_image(x, "encode");
  const vae::EncoderModules& m = *modules_;
  Tensor h = m.conv_in(x.dtype() == DType::f32 ? x : ops::cast(x, DType::f32, stream), stream);
  for (const vae::DownEncoderBlock& block : m.down_blocks) h = block(h, stream);
  h = m.mid_block(h, stream);
  h = m.conv_out(m.conv_norm_out(h, stream, true), stream);
  return m.has_quant_conv ? m.quant_conv(h, stream) : h;
}

Tensor AutoencoderKLEncoder::moments_tiled(const Tensor& x, const Stream& stream) const {
  check_image(x, "encode");
  // diffusers: tile_sample_min_size = sample_size, tile_latent_min_size = sample_size / upscale,
  // tile_overlap_factor 0.25; an image no larger than one tile is encoded whole.
  const int64_t tile = config_.sample_size, tile_latent = config_.tile_latent_size();
  if ((x.size(2) <= tile && x.size(3) <= tile) || tile_latent < 1) return moments(x, stream);
  const int64_t step = tile * 3 / 4, blend = tile_latent / 4, keep = tile_latent - blend;
  return vae::encode_in_tiles(
      x, tile, step, config_.upscale(), blend, keep, [&](const Tensor& t) { return moments(t, stream); }, stream);
}

LatentDistribution AutoencoderKLEncoder::encode(const Tensor& x, const Stream& stream) const {
  return latent_distribution(moments_tiled(x, stream), stream);
}

AutoencoderKLEncoder load_autoencoder_kl_encoder(const std::string& dir, DType dtype, const std::string& variant) {
  AutoencoderKLEncoder model(AutoencoderKLConfig::load(dir + "/config.json"));
  LoadOptions options;
  options.unexpected_prefixes = {"encoder.", "quant_conv."};  // decoder.* and post_quant_conv.* are the decoder's
  load_parameters(model.parameters(), open_component_weights(dir, variant), dtype, options);
  return model;
}

}  // namespace cubevec::models
