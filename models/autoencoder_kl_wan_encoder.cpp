#include "models/autoencoder_kl_wan_encoder.h"

#include <algorithm>
#include <utility>

#include "base/error.h"
#include "models/component.h"
#include "models/wan_vae_regroup.h"
#include "ops/conv.h"
#include "ops/vector_ops.h"

namespace cubevec::models {

namespace {

// diffusers' _encode: the first frame alone, then this many frames per chunk.
constexpr int64_t kFramesPerChunk = 4;

Tensor as_f32(const Tensor& t, const Stream& stream) {
  return !t.defined() || t.dtype() == DType::f32 ? t : ops::cast(t, DType::f32, stream);
}

}  // namespace

namespace wan_vae {

void Downsample::declare(ParameterTable& table, const std::string& prefix, int64_t channels, bool downsample_time, int& slots) {
  temporal = downsample_time;
  spatial.declare(table, prefix, channels, ".resample.1");
  if (temporal) {
    table.add(prefix + ".time_conv.weight", {channels, channels, 3, 1, 1}, &time_weight);
    table.add(prefix + ".time_conv.bias", {channels}, &time_bias);
    slot = slots++;
  }
}

Tensor Downsample::operator()(const Tensor& x, FeatureCache& cache, const Stream& stream) const {
  const int64_t t = x.size(2);
  std::vector<Tensor> frames;
  frames.reserve(static_cast<std::size_t>(t));
  for (int64_t i = 0; i < t; ++i) {
    frames.push_back(spatial(x.select(2, i), stream).unsqueeze(2));
    cache.pace(stream);
  }
  Tensor y = frames.size() == 1 ? ops::contiguous(frames.front(), stream) : ops::concat(frames, 2, stream);
  if (!temporal) return y;
  Tensor& held = cache.frames.at(static_cast<std::size_t>(slot));
  Tensor last = ops::contiguous(y.narrow(2, t - 1, 1), stream);
  if (held.defined()) {
    // [the previous chunk's last frame, this chunk's frames], no padding, stride 2 in time.
    ops::Conv3dOptions options;
    options.stride = {2, 1, 1};
    y = ops::conv3d(ops::concat({held, y}, 2, stream), as_f32(time_weight, stream), as_f32(time_bias, stream), options, stream);
    cache.pace(stream);
  }
  held = std::move(last);  // the video's first chunk only leaves its last frame for the next
  return y;
}

void ResidualDownBlock::declare(ParameterTable& table, const std::string& prefix, int64_t in, int64_t out_channels, int64_t num_resnets,
                                bool downsample, bool temporal, int& slots) {
  out = out_channels;
  time_factor = downsample && temporal ? 2 : 1;
  space_factor = downsample ? 2 : 1;
  resnets.resize(static_cast<std::size_t>(num_resnets));
  for (std::size_t j = 0; j < resnets.size(); ++j)
    resnets[j].declare(table, prefix + ".resnets." + std::to_string(j), j == 0 ? in : out, out, slots);
  has_downsampler = downsample;
  if (downsample) downsampler.declare(table, prefix + ".downsampler", out, temporal, slots);
}

Tensor ResidualDownBlock::operator()(const Tensor& x, FeatureCache& cache, const Stream& stream) const {
  Tensor y = x;
  for (const ResidualBlock& resnet : resnets) y = resnet(y, cache, stream);
  if (has_downsampler) y = downsampler(y, cache, stream);
  y = ops::add(y, avg_down_3d(x, out, time_factor, space_factor, stream), stream);
  cache.pace(stream);
  return y;
}

}  // namespace wan_vae

AutoencoderKLWanEncoder::AutoencoderKLWanEncoder(AutoencoderKLWanConfig config)
    : config_(std::move(config)), modules_(std::make_unique<wan_vae::EncoderModules>()) {
  validate_autoencoder_kl_wan_config(config_, "AutoencoderKLWanEncoder");
  if (!config_.attn_scales.empty())
    throw Error(
        "AutoencoderKLWanEncoder: 'attn_scales' must be [] (diffusers' encoder cannot run its down-block attention with "
        "the chunk cache either), got " +
        std::to_string(config_.attn_scales.size()) + " entries");
  if (config_.temporal_upscale() > kFramesPerChunk)
    throw Error("AutoencoderKLWanEncoder: 'temperal_downsample' halves time " +
                std::to_string(std::count(config_.temperal_downsample.begin(), config_.temperal_downsample.end(), true)) +
                " times; diffusers' 4-frame chunks allow at most 2");
  wan_vae::EncoderModules& m = *modules_;
  int& slots = m.cache_slots;
  std::vector<int64_t> dims = {config_.base_dim};
  for (int64_t mult : config_.dim_mult) dims.push_back(config_.base_dim * mult);
  m.conv_in.declare(table_, "encoder.conv_in", config_.in_channels, dims[0], {3, 3, 3}, {1, 1, 1}, slots);
  const std::size_t levels = config_.dim_mult.size();
  if (config_.is_residual) {
    m.residual_down_blocks.resize(levels);
    for (std::size_t i = 0; i < levels; ++i)
      m.residual_down_blocks[i].declare(table_, "encoder.down_blocks." + std::to_string(i), dims[i], dims[i + 1], config_.num_res_blocks,
                                        i + 1 < levels, i + 1 < levels && config_.temperal_downsample[i], slots);
  }
  // The table holds pointers into the layers: the list must never reallocate.
  m.down_blocks.reserve(levels * static_cast<std::size_t>(config_.num_res_blocks) + levels - 1);
  for (std::size_t i = 0; !config_.is_residual && i < levels; ++i) {
    int64_t in = dims[i];
    for (int64_t j = 0; j < config_.num_res_blocks; ++j) {
      wan_vae::DownLayer& layer = m.down_blocks.emplace_back();
      layer.residual.declare(table_, "encoder.down_blocks." + std::to_string(m.down_blocks.size() - 1), in, dims[i + 1], slots);
      in = dims[i + 1];
    }
    if (i + 1 < levels) {
      wan_vae::DownLayer& layer = m.down_blocks.emplace_back();
      layer.is_downsample = true;
      layer.downsample.declare(table_, "encoder.down_blocks." + std::to_string(m.down_blocks.size() - 1), dims[i + 1],
                               config_.temperal_downsample[i], slots);
    }
  }
  m.mid_block.declare(table_, "encoder.mid_block", dims.back(), slots);
  m.norm_out.declare(table_, "encoder.norm_out", dims.back(), false);
  m.conv_out.declare(table_, "encoder.conv_out", dims.back(), 2 * config_.z_dim, {3, 3, 3}, {1, 1, 1}, slots);
  m.quant_conv.declare(table_, "quant_conv", 2 * config_.z_dim, 2 * config_.z_dim, {1, 1, 1}, {0, 0, 0}, slots);
}

int64_t AutoencoderKLWanEncoder::latent_frames(int64_t frames) const {
  if (frames < 1 || (frames - 1) % kFramesPerChunk != 0)
    throw Error("AutoencoderKLWan encode: the video must have 1 + 4k frames (1, 5, 9, ..., 81), got " + std::to_string(frames));
  return 1 + (frames - 1) / config_.temporal_upscale();
}

uint64_t AutoencoderKLWanEncoder::estimate_peak_bytes(int64_t batch, int64_t height, int64_t width) const {
  // Widths halve the pixels at each downsample while the channels grow at most 4x: the first
  // level dominates. Caches: conv_in's input channels plus the first level's convs (2 frames
  // each). The encoder runs at the patchified resolution; a residual block also keeps its input and
  // AvgDown3D's regrouped copy of it.
  const double cells = static_cast<double>(config_.patch_size * config_.patch_size);
  const double pixels = static_cast<double>(batch) * static_cast<double>(height) * static_cast<double>(width) / cells;
  const double base = static_cast<double>(config_.base_dim);
  const double chunk = 4.0 * kFramesPerChunk * base * pixels;  // one activation of a 4-frame chunk, f32
  const double caches =
      4.0 * 2.0 * pixels * (static_cast<double>(config_.in_channels) + base * static_cast<double>(2 * config_.num_res_blocks));
  const double activations = config_.is_residual ? 8.0 : 6.0;
  const double total = activations * chunk + 2.0 * caches + static_cast<double>(int64_t{64} << 20);
  return total > 1.8e19 ? UINT64_MAX : static_cast<uint64_t>(total);
}

Tensor AutoencoderKLWanEncoder::moments_whole(const Tensor& x, const Stream& stream) const {
  const wan_vae::EncoderModules& m = *modules_;
  wan_vae::FeatureCache cache(m.cache_slots, 0);
  std::vector<Tensor> out;
  const int64_t frames = x.size(2);
  for (int64_t start = 0; start < frames;) {
    const int64_t count = start == 0 ? 1 : kFramesPerChunk;
    // Patchified per chunk (it is per frame): no second copy of the whole video.
    Tensor h = m.conv_in(wan_vae::patchify(x.narrow(2, start, count), config_.patch_size, stream), cache, stream);
    for (const wan_vae::DownLayer& layer : m.down_blocks)
      h = layer.is_downsample ? layer.downsample(h, cache, stream) : layer.residual(h, cache, stream);
    for (const wan_vae::ResidualDownBlock& block : m.residual_down_blocks) h = block(h, cache, stream);
    h = m.mid_block(std::move(h), cache, stream);
    h = m.norm_out(h, stream, true);
    cache.pace(stream);
    h = m.conv_out(h, cache, stream);
    out.push_back(m.quant_conv(h, cache, stream));  // 1x1x1: per chunk as on the whole
    cache.pace(stream);
    start += count;
  }
  return out.size() == 1 ? out.front() : ops::concat(out, 2, stream);
}

Tensor AutoencoderKLWanEncoder::moments(const Tensor& x_in, const WanEncodeOptions& options, const Stream& stream) const {
  const int64_t scale = config_.spatial_upscale();
  if (!x_in.defined() || x_in.dim() != 5 || x_in.size(1) != config_.encoder_video_channels() ||
      (x_in.dtype() != DType::f32 && x_in.dtype() != DType::bf16) || x_in.size(0) < 1 || x_in.size(3) < scale || x_in.size(4) < scale ||
      x_in.size(3) % scale != 0 || x_in.size(4) % scale != 0)
    throw Error("AutoencoderKLWan encode: the video must be f32 or bf16 [B, " + std::to_string(config_.encoder_video_channels()) +
                ", T, H, W] with H and W positive multiples of " + std::to_string(scale) + ", got " +
                (x_in.defined() ? x_in.describe() : std::string("an undefined tensor")));
  const int64_t latent_t = latent_frames(x_in.size(2));
  if (options.tiling && config_.patch_size > 1)
    throw Error("AutoencoderKLWan encode: tiling is not supported with patch_size " + std::to_string(config_.patch_size) +
                " (Wan2.2's VAE); encode without tiling");
  if (options.tiling &&
      (options.tile_sample_min < scale || options.tile_sample_stride < scale || options.tile_sample_stride > options.tile_sample_min ||
       options.tile_sample_min % scale != 0 || options.tile_sample_stride % scale != 0))
    throw Error("AutoencoderKLWan encode: the tiles must be multiples of " + std::to_string(scale) + " with stride <= size, got size " +
                std::to_string(options.tile_sample_min) + " and stride " + std::to_string(options.tile_sample_stride));
  const Tensor x = ops::contiguous(as_f32(x_in, stream), stream);
  const int64_t b = x.size(0), h = x.size(3), w = x.size(4);
  if (!options.tiling || (h <= options.tile_sample_min && w <= options.tile_sample_min)) return moments_whole(x, stream);
  // diffusers' tiled_encode: each spatial tile encoded over every frame with its own caches; the
  // blend is per element, so the frames ride along as channels [B, C T, H, W].
  const int64_t c = x.size(1), t = x.size(2), zc = 2 * config_.z_dim;
  const int64_t tile_latent = options.tile_sample_min / scale, stride_latent = options.tile_sample_stride / scale;
  const Tensor tiled = vae::encode_in_tiles(
      x.reshape({b, c * t, h, w}), options.tile_sample_min, options.tile_sample_stride, scale, tile_latent - stride_latent, stride_latent,
      [&](const Tensor& tile) {
        const Tensor video = ops::contiguous(tile, stream).reshape({b, c, t, tile.size(2), tile.size(3)});
        const Tensor moments = moments_whole(video, stream);
        return moments.reshape({b, zc * latent_t, moments.size(3), moments.size(4)});
      },
      stream);
  return tiled.reshape({b, zc, latent_t, h / scale, w / scale});
}

LatentDistribution AutoencoderKLWanEncoder::encode(const Tensor& x, const WanEncodeOptions& options, const Stream& stream) const {
  return latent_distribution(moments(x, options, stream), stream);
}

Tensor AutoencoderKLWanEncoder::normalize(const Tensor& latents, const Stream& stream) const {
  const int64_t zc = config_.z_dim;
  if (!latents.defined() || latents.dim() != 5 || latents.size(1) != zc ||
      (latents.dtype() != DType::f32 && latents.dtype() != DType::bf16))
    throw Error("AutoencoderKLWan normalize: latents must be f32 or bf16 [B, " + std::to_string(zc) + ", T, h, w], got " +
                (latents.defined() ? latents.describe() : std::string("an undefined tensor")));
  // As WanImageToVideoPipeline in f32: (latents - mean) * (1 / std), mean and std rounded to f32 first.
  std::vector<float> mean(static_cast<std::size_t>(zc)), inv_std(static_cast<std::size_t>(zc));
  for (std::size_t i = 0; i < mean.size(); ++i) {
    mean[i] = static_cast<float>(config_.latents_mean[i]);
    inv_std[i] = 1.0f / static_cast<float>(config_.latents_std[i]);
  }
  const Tensor centred = ops::sub(as_f32(latents, stream), Tensor::from_vector(mean, {1, zc, 1, 1, 1}), stream);
  return ops::mul(centred, Tensor::from_vector(inv_std, {1, zc, 1, 1, 1}), stream);
}

AutoencoderKLWanEncoder load_autoencoder_kl_wan_encoder(const std::string& dir, DType dtype, const std::string& variant) {
  AutoencoderKLWanEncoder model(AutoencoderKLWanConfig::load(dir + "/config.json"));
  LoadOptions options;
  options.unexpected_prefixes = {"encoder.", "quant_conv."};  // decoder.* and post_quant_conv.* are the decoder's
  load_parameters(model.parameters(), open_component_weights(dir, variant), dtype, options);
  return model;
}

}  // namespace cubevec::models
