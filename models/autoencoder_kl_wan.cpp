#include "models/autoencoder_kl_wan.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "models/component.h"
#include "models/wan_vae_regroup.h"
#include "ops/attention.h"
#include "ops/conv.h"
#include "ops/vector_ops.h"
#include "base/error.h"
#include "base/config_reader.h"
#include "tensor/finite_check.h"
#include "base/strict_json.h"

namespace cubevec::models {

// --- config -------------------------------------------------------------------------------------

namespace {

int64_t power_of_two(std::size_t exponent) { return int64_t{1} << exponent; }

}  // namespace

void validate_autoencoder_kl_wan_config(const AutoencoderKLWanConfig& c, const std::string& source) {
  const auto positive = [&](int64_t v, const char* key) {
    if (v < 1) throw Error(source + ": '" + key + "' must be >= 1, got " + std::to_string(v));
  };
  positive(c.base_dim, "base_dim");
  positive(c.z_dim, "z_dim");
  positive(c.in_channels, "in_channels");
  positive(c.out_channels, "out_channels");
  if (c.decoder_base_dim < 0)
    throw Error(source + ": 'decoder_base_dim' must be >= 1 (or 0 / null for base_dim), got " + std::to_string(c.decoder_base_dim));
  if (c.num_res_blocks < 0 || c.num_res_blocks > 64)
    throw Error(source + ": 'num_res_blocks' must be in [0, 64], got " + std::to_string(c.num_res_blocks));
  if (c.dim_mult.empty() || c.dim_mult.size() > 8)
    throw Error(source + ": 'dim_mult' must list 1 to 8 multipliers, got " + std::to_string(c.dim_mult.size()));
  for (int64_t m : c.dim_mult) {
    if (m < 1) throw Error(source + ": every 'dim_mult' entry must be >= 1, got " + std::to_string(m));
    if (m > 65536 / std::max<int64_t>(1, c.decoder_dim()))
      throw Error(source + ": decoder width " + std::to_string(c.decoder_dim()) + " x dim_mult " + std::to_string(m) +
                  " exceeds 65536 channels");
  }
  for (std::size_t i = 0; !c.is_residual && i + 1 < c.dim_mult.size(); ++i)
    if (c.decoder_dim() * c.dim_mult[c.dim_mult.size() - 1 - i] < 2)
      throw Error(source + ": up block " + std::to_string(i) + " upsamples and halves its width, which needs at least 2 channels, got " +
                  std::to_string(c.decoder_dim() * c.dim_mult[c.dim_mult.size() - 1 - i]));
  if (c.temperal_downsample.size() + 1 != c.dim_mult.size())
    throw Error(source + ": 'temperal_downsample' must have len(dim_mult) - 1 = " + std::to_string(c.dim_mult.size() - 1) +
                " entries, got " + std::to_string(c.temperal_downsample.size()));
  if (c.patch_size < 1 || c.patch_size > 64)
    throw Error(source + ": 'patch_size' must be in [1, 64] (null for 1), got " + std::to_string(c.patch_size));
  for (const auto& [channels, key] : {std::pair{c.in_channels, "in_channels"}, std::pair{c.out_channels, "out_channels"}})
    if (channels % (c.patch_size * c.patch_size) != 0)
      throw Error(source + ": '" + key + "' " + std::to_string(channels) + " must be a multiple of 'patch_size' squared (" +
                  std::to_string(c.patch_size * c.patch_size) + "): the video's channels times its pixel cells");
  if (c.is_residual) {
    // The shortcuts regroup whole channels: AvgDown3D averages runs of in ft fs^2 / out of them,
    // DupUp3D repeats each out ft fs^2 / in times.
    const std::size_t n = c.dim_mult.size();
    for (std::size_t i = 0; i < n; ++i) {
      const int64_t in = c.base_dim * (i == 0 ? 1 : c.dim_mult[i - 1]), out = c.base_dim * c.dim_mult[i];
      const int64_t cells = i + 1 < n ? (c.temperal_downsample[i] ? 8 : 4) : 1;
      if (in * cells % out != 0)
        throw Error(source + ": 'is_residual': encoder level " + std::to_string(i) + "'s shortcut (AvgDown3D) cannot average " +
                    std::to_string(in) + " channels x " + std::to_string(cells) + " cell positions into " + std::to_string(out) +
                    " channels; check 'base_dim' and 'dim_mult'");
    }
    const std::vector<bool> temporal = c.temperal_upsample();
    for (std::size_t i = 0; i + 1 < n; ++i) {
      const int64_t in = c.decoder_dim() * c.dim_mult[i == 0 ? n - 1 : n - i], out = c.decoder_dim() * c.dim_mult[n - 1 - i];
      const int64_t cells = temporal[i] ? 8 : 4;
      if (out * cells % in != 0)
        throw Error(source + ": 'is_residual': decoder up block " + std::to_string(i) + "'s shortcut (DupUp3D) cannot spread " +
                    std::to_string(in) + " channels over " + std::to_string(out) + " channels x " + std::to_string(cells) +
                    " cell positions; check 'decoder_base_dim' and 'dim_mult'");
    }
  }
  if (!(c.dropout >= 0.0 && c.dropout <= 1.0)) throw Error(source + ": 'dropout' must be in [0, 1], got " + std::to_string(c.dropout));
  for (const auto& [list, key] : {std::pair{&c.latents_mean, "latents_mean"}, std::pair{&c.latents_std, "latents_std"}})
    if (static_cast<int64_t>(list->size()) != c.z_dim)
      throw Error(source + ": '" + key + "' must list z_dim = " + std::to_string(c.z_dim) + " numbers, got " +
                  std::to_string(list->size()));
  // The pipeline multiplies latents by std and adds mean: 1e-320 or 1e308 pass as finite but turn
  // the decoder's input into zeros or infinities.
  for (double s : c.latents_std)
    if (!(std::fabs(s) >= 1e-6 && std::fabs(s) <= 1e6))
      throw Error(source + ": every 'latents_std' entry must be a finite number of magnitude in [1e-6, 1e6], got " + number_for_message(s));
  for (double m : c.latents_mean)
    if (!(std::fabs(m) <= 1e6))
      throw Error(source + ": every 'latents_mean' entry must be a finite number in [-1e6, 1e6], got " + number_for_message(m));
  if (c.scale_factor_temporal != c.temporal_upscale())
    throw Error(source + ": 'scale_factor_temporal' " + std::to_string(c.scale_factor_temporal) +
                " does not match the decoder, which upsamples time " + std::to_string(c.temporal_upscale()) + "x");
  if (c.scale_factor_spatial != c.spatial_upscale())
    throw Error(source + ": 'scale_factor_spatial' " + std::to_string(c.scale_factor_spatial) +
                " does not match the decoder, which upsamples space " + std::to_string(c.spatial_upscale()) +
                "x (2^(len(dim_mult) - 1) x patch_size)");
}

int64_t AutoencoderKLWanConfig::temporal_upscale() const {
  return power_of_two(static_cast<std::size_t>(std::count(temperal_downsample.begin(), temperal_downsample.end(), true)));
}

AutoencoderKLWanConfig AutoencoderKLWanConfig::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "AutoencoderKLWan");
  r.expect_class({"AutoencoderKLWan"});
  AutoencoderKLWanConfig c;
  bool clip_output = true;
  r.integer("base_dim", c.base_dim, 1)
      .integer("decoder_base_dim", c.decoder_base_dim, 1)
      .integer("z_dim", c.z_dim, 1)
      .integers("dim_mult", c.dim_mult, 1)
      .integer("num_res_blocks", c.num_res_blocks, 0)
      .numbers("attn_scales", c.attn_scales)  // the encoder's
      .booleans("temperal_downsample", c.temperal_downsample)
      .number_in("dropout", c.dropout, 0.0, 1.0)
      .numbers("latents_mean", c.latents_mean)
      .numbers("latents_std", c.latents_std)
      .boolean("is_residual", c.is_residual)
      .integer("patch_size", c.patch_size, 1, 64)
      .integer("in_channels", c.in_channels, 1)
      .integer("out_channels", c.out_channels, 1)
      .integer("scale_factor_temporal", c.scale_factor_temporal, 1)
      .integer("scale_factor_spatial", c.scale_factor_spatial, 1)
      .boolean("clip_output", clip_output);  // an older diffusers key; the video is always clamped
  r.reject_unknown();
  for (const char* key : {"latents_mean", "latents_std"})
    if (r.contains(key) && !r.has(key)) r.fail(key, "must be a list of finite numbers, got null");
  // Left out or null: what the architecture gives (checked against it otherwise).
  if (!r.has("scale_factor_temporal") && c.temperal_downsample.size() + 1 == c.dim_mult.size() && c.dim_mult.size() <= 8)
    c.scale_factor_temporal = c.temporal_upscale();
  if (!r.has("scale_factor_spatial") && c.dim_mult.size() >= 1 && c.dim_mult.size() <= 8) c.scale_factor_spatial = c.spatial_upscale();
  validate_autoencoder_kl_wan_config(c, source);
  return c;
}

AutoencoderKLWanConfig AutoencoderKLWanConfig::load(const std::string& config_path) {
  return from_json(read_json_file(config_path), config_path);
}

AutoencoderKLWanConfig AutoencoderKLWanConfig::wan21() { return AutoencoderKLWanConfig{}; }

// --- blocks -------------------------------------------------------------------------------------

namespace wan_vae {

namespace {

Tensor as_f32(const Tensor& t, const Stream& stream) {
  return !t.defined() || t.dtype() == DType::f32 ? t : ops::cast(t, DType::f32, stream);
}

void check_5d(const Tensor& x, int64_t channels, const char* what) {
  if (!x.defined() || x.dim() != 5 || x.size(1) != channels || x.dtype() != DType::f32)
    throw Error(std::string(what) + ": expected f32 [B, " + std::to_string(channels) + ", T, H, W], got " +
                (x.defined() ? x.describe() : std::string("an undefined tensor")));
}

}  // namespace

int64_t FeatureCache::bytes() const {
  int64_t total = 0;
  for (const Tensor& t : frames)
    if (t.defined()) total += static_cast<int64_t>(t.nbytes());
  return total;
}

void CausalConv3d::declare(ParameterTable& table, const std::string& name, int64_t in_channels, int64_t out_channels,
                           std::array<int64_t, 3> kernel_size, std::array<int64_t, 3> conv_padding, int& slots) {
  in = in_channels;
  out = out_channels;
  kernel = kernel_size;
  padding = conv_padding;
  table.add(name + ".weight", {out, in, kernel[0], kernel[1], kernel[2]}, &weight);
  table.add(name + ".bias", {out}, &bias);
  slot = padding[0] > 0 ? slots++ : -1;
}

Tensor CausalConv3d::operator()(const Tensor& x, const Tensor& cache, const Stream& stream) const {
  return convolve(x, cache, padding[1], stream);
}

Tensor CausalConv3d::convolve(const Tensor& x, const Tensor& cache, int64_t row_padding, const Stream& stream,
                              const Tensor& residual) const {
  check_5d(x, in, "WanCausalConv3d input");
  const int64_t tc = cache.defined() ? cache.size(2) : 0;
  if (cache.defined()) {
    check_5d(cache, in, "WanCausalConv3d cache");
    if (tc > context() || cache.size(0) != x.size(0) || cache.size(3) != x.size(3) || cache.size(4) != x.size(4))
      throw Error("WanCausalConv3d: the cache must be [B, C, t <= " + std::to_string(context()) + ", H, W] matching the input " +
                  shape_to_string(x.shape()) + ", got " + shape_to_string(cache.shape()));
  }
  ops::Conv3dOptions options;
  options.padding = {0, row_padding, padding[2]};
  const Tensor input = context() > 0 ? ops::pad_frames_front(x, cache, context() - tc, stream) : ops::contiguous(x, stream);
  if (residual.defined()) return ops::conv3d_add(input, as_f32(weight, stream), as_f32(bias, stream), residual, options, stream);
  return ops::conv3d(input, as_f32(weight, stream), as_f32(bias, stream), options, stream);
}

Tensor CausalConv3d::operator()(const Tensor& x_band, FeatureCache& cache, const Stream& stream, const Tensor& residual) const {
  // Patch parallel: the band with its neighbours' edge rows, so the conv and the frames it caches
  // see what one device would; the rows then need no zero padding.
  const bool halo = cache.rows && padding[1] > 0;
  const Tensor x = halo ? cache.rows->with_halo(x_band, padding[1], stream) : x_band;
  const int64_t row_padding = halo ? 0 : padding[1];
  if (slot < 0) return convolve(x, Tensor(), row_padding, stream, residual);
  Tensor& held = cache.frames.at(static_cast<std::size_t>(slot));
  Tensor y = convolve(x, held, row_padding, stream, residual);
  cache.pace(stream);
  // The last context() frames of [held, x], copied so the chunk's activations can be freed.
  const int64_t t = x.size(2), ctx = context();
  if (t >= ctx) {
    held = ops::contiguous(x.narrow(2, t - ctx, ctx), stream);
  } else if (held.defined()) {
    const int64_t keep = std::min(held.size(2), ctx - t);
    held = ops::concat({held.narrow(2, held.size(2) - keep, keep), x}, 2, stream);
  } else {
    held = ops::contiguous(x, stream);
  }
  return y;
}

void RMSNorm::declare(ParameterTable& table, const std::string& name, int64_t num_channels, bool images) {
  channels = num_channels;
  table.add(name + ".gamma", images ? Shape{channels, 1, 1} : Shape{channels, 1, 1, 1}, &gamma, /*keep_f32=*/true);
}

Tensor RMSNorm::operator()(const Tensor& x, const Stream& stream, bool silu) const {
  // diffusers: F.normalize(x, dim=1) (eps 1e-12 on the norm) * dim**0.5 * gamma.
  const auto scale = static_cast<float>(std::sqrt(static_cast<double>(channels)));
  const Tensor g = gamma.reshape({channels});
  return silu ? ops::normalize_channels_silu(x, g, scale, 1e-12f, stream) : ops::normalize_channels(x, g, scale, 1e-12f, stream);
}

void ResidualBlock::declare(ParameterTable& table, const std::string& prefix, int64_t in, int64_t out, int& slots) {
  norm1.declare(table, prefix + ".norm1", in, false);
  conv1.declare(table, prefix + ".conv1", in, out, {3, 3, 3}, {1, 1, 1}, slots);
  norm2.declare(table, prefix + ".norm2", out, false);
  conv2.declare(table, prefix + ".conv2", out, out, {3, 3, 3}, {1, 1, 1}, slots);
  has_shortcut = in != out;
  if (has_shortcut) conv_shortcut.declare(table, prefix + ".conv_shortcut", in, out, {1, 1, 1}, {0, 0, 0}, slots);
}

Tensor ResidualBlock::operator()(const Tensor& x, FeatureCache& cache, const Stream& stream) const {
  const Tensor h = has_shortcut ? conv_shortcut(x, Tensor(), stream) : x;
  Tensor y = norm1(x, stream, true);
  cache.pace(stream);
  y = conv1(y, cache, stream);
  y = norm2(y, stream, true);
  cache.pace(stream);
  // Dropout is inactive; the skip is added as conv2 stores its output (bit for bit add(h, conv2(y)))
  // where h is f32 and contiguous, as the decoder's activations are.
  if (h.dtype() == DType::f32 && h.is_contiguous()) {
    y = conv2(y, cache, stream, h);
  } else {
    y = conv2(y, cache, stream);
    y = ops::add(h, y, stream);
  }
  cache.pace(stream);
  return y;
}

void AttentionBlock::declare(ParameterTable& table, const std::string& prefix, int64_t num_channels) {
  channels = num_channels;
  norm.declare(table, prefix + ".norm", channels, true);
  table.add(prefix + ".to_qkv.weight", {3 * channels, channels, 1, 1}, &qkv_weight);
  table.add(prefix + ".to_qkv.bias", {3 * channels}, &qkv_bias);
  table.add(prefix + ".proj.weight", {channels, channels, 1, 1}, &proj_weight);
  table.add(prefix + ".proj.bias", {channels}, &proj_bias);
}

Tensor AttentionBlock::operator()(const Tensor& x_in, const Stream& stream, const RowSplit* rows) const {
  const Tensor x = ops::contiguous(x_in, stream);
  // Patch parallel: every rank's rows for the keys and values; the queries are this band's.
  const Tensor all = rows ? rows->gather(x, stream) : x;
  const int64_t b = x.size(0), c = channels, t = x.size(2), hw = x.size(3) * x.size(4);
  const int64_t all_hw = all.size(3) * all.size(4), first = rows ? rows->band(x.size(3)).first * x.size(4) : 0;
  // Each frame's positions as tokens: [B T HW, C], rows in (b, t, h, w) order.
  const Tensor tokens = ops::contiguous(norm(all, stream).reshape({b, c, t * all_hw}).transpose(1, 2), stream).reshape({b * t * all_hw, c});
  ops::MatmulOptions qkv_options;
  qkv_options.bias = as_f32(qkv_bias, stream);
  qkv_options.b_is_weight = true;
  const Tensor qkv =
      ops::matmul(tokens, as_f32(qkv_weight, stream).reshape({3 * c, c}), qkv_options, stream).reshape({b * t, all_hw, 3 * c});
  // One head of width C in BSND, one sequence per frame; the default scale is C^-0.5.
  const auto head = [&](int64_t i) { return qkv.narrow(2, i * c, c).unsqueeze(2); };
  const Tensor q = rows ? head(0).narrow(1, first, hw) : head(0);
  const Tensor a = ops::contiguous(ops::attention_forward(q, head(1), head(2), {}, stream), stream);
  ops::MatmulOptions proj_options;
  proj_options.bias = as_f32(proj_bias, stream);
  proj_options.b_is_weight = true;
  const Tensor o = ops::matmul(a.reshape({b * t * hw, c}), as_f32(proj_weight, stream).reshape({c, c}), proj_options, stream);
  return ops::add(x.reshape({b, c, t * hw}), o.reshape({b, t * hw, c}).transpose(1, 2), stream).reshape(x.shape());
}

void Resample::declare(ParameterTable& table, const std::string& prefix, int64_t channels, Mode resample_mode, int& slots, int& upsamplers,
                       int64_t out_channels) {
  mode = resample_mode;
  resample.declare(table, prefix + ".resample.1", channels, out_channels > 0 ? out_channels : channels / 2, 3, 1, 1);
  if (mode == Mode::upsample3d) {
    time_conv.declare(table, prefix + ".time_conv", channels, 2 * channels, {3, 1, 1}, {1, 0, 0}, slots);
    first_chunk_slot = upsamplers++;
  }
}

bool Resample::first_chunk(const FeatureCache& cache) const {
  return mode == Mode::upsample3d && !cache.started.at(static_cast<std::size_t>(first_chunk_slot));
}

Tensor Resample::operator()(const Tensor& x, FeatureCache& cache, const Stream& stream) const {
  const int64_t c = resample.in, t = x.size(2);
  std::vector<Tensor> frames;  // [B, C, H, W] views, in time order
  int64_t first = 0;
  if (mode == Mode::upsample3d) {
    std::vector<bool>::reference started = cache.started.at(static_cast<std::size_t>(first_chunk_slot));
    if (!started && t > 0) {
      // The video's first frame passes through alone (no time_conv, never its context).
      started = true;
      frames.push_back(x.select(2, 0));
      first = 1;
    }
    if (t > first) {
      // Each frame becomes two: channels [0, C) the earlier, [C, 2C) the later.
      const Tensor doubled = time_conv(x.narrow(2, first, t - first), cache, stream);
      for (int64_t i = 0; i < t - first; ++i) {
        frames.push_back(doubled.narrow(1, 0, c).select(2, i));
        frames.push_back(doubled.narrow(1, c, c).select(2, i));
      }
    }
  } else {
    for (int64_t i = 0; i < t; ++i) frames.push_back(x.select(2, i));
  }
  // Per frame: nearest 2x, then the 3x3 conv to C/2 channels.
  std::vector<Tensor> out;
  out.reserve(frames.size());
  for (const Tensor& f : frames) {
    const Tensor up = ops::upsample_nearest2d(f, 2, stream);
    // Patch parallel: the upsampled band with its halo rows, convolved without row padding.
    const Tensor frame = cache.rows
                             ? resample.with_padding(cache.rows->with_halo(up, resample.padding, stream), 0, resample.padding, stream)
                             : resample(up, stream);
    out.push_back(frame.unsqueeze(2));
    cache.pace(stream);
  }
  return out.size() == 1 ? out.front() : ops::concat(out, 2, stream);
}

void MidBlock::declare(ParameterTable& table, const std::string& prefix, int64_t channels, int& slots) {
  resnet0.declare(table, prefix + ".resnets.0", channels, channels, slots);
  attention.declare(table, prefix + ".attentions.0", channels);
  resnet1.declare(table, prefix + ".resnets.1", channels, channels, slots);
}

Tensor MidBlock::operator()(Tensor x, FeatureCache& cache, const Stream& stream) const {
  x = resnet0(x, cache, stream);
  x = attention(x, stream, cache.rows);
  cache.pace(stream);
  return resnet1(x, cache, stream);
}

void UpBlock::declare(ParameterTable& table, const std::string& prefix, int64_t in, int64_t out, int64_t num_resnets, bool upsample,
                      bool temporal, int& slots, int& upsamplers) {
  resnets.resize(static_cast<std::size_t>(num_resnets));
  for (std::size_t j = 0; j < resnets.size(); ++j)
    resnets[j].declare(table, prefix + ".resnets." + std::to_string(j), j == 0 ? in : out, out, slots);
  has_upsampler = upsample;
  if (has_upsampler)
    upsampler.declare(table, prefix + ".upsamplers.0", out, temporal ? Resample::Mode::upsample3d : Resample::Mode::upsample2d, slots,
                      upsamplers);
}

Tensor UpBlock::operator()(Tensor x, FeatureCache& cache, const Stream& stream) const {
  for (const ResidualBlock& resnet : resnets) x = resnet(x, cache, stream);
  return has_upsampler ? upsampler(x, cache, stream) : x;
}

void ResidualUpBlock::declare(ParameterTable& table, const std::string& prefix, int64_t in, int64_t out_channels, int64_t num_resnets,
                              bool upsample, bool temporal, int& slots, int& upsamplers) {
  out = out_channels;
  time_factor = upsample && temporal ? 2 : 1;
  body.resnets.resize(static_cast<std::size_t>(num_resnets));
  for (std::size_t j = 0; j < body.resnets.size(); ++j)
    body.resnets[j].declare(table, prefix + ".resnets." + std::to_string(j), j == 0 ? in : out, out, slots);
  body.has_upsampler = upsample;
  if (upsample)
    body.upsampler.declare(table, prefix + ".upsampler", out, temporal ? Resample::Mode::upsample3d : Resample::Mode::upsample2d, slots,
                           upsamplers, out);
}

Tensor ResidualUpBlock::operator()(Tensor x, FeatureCache& cache, const Stream& stream) const {
  if (!body.has_upsampler) return body(std::move(x), cache, stream);  // the last block: no shortcut
  const bool first_chunk = body.upsampler.first_chunk(cache);         // before the upsampler starts
  const Tensor y = body(x, cache, stream);
  Tensor sum = ops::add(y, dup_up_3d(x, out, time_factor, 2, first_chunk, stream), stream);
  cache.pace(stream);
  return sum;
}

}  // namespace wan_vae

// --- the decoder --------------------------------------------------------------------------------

std::vector<const wan_vae::UpBlock*> wan_vae::DecoderModules::up_block_bodies() const {
  std::vector<const UpBlock*> bodies;
  for (const UpBlock& block : up_blocks) bodies.push_back(&block);
  for (const ResidualUpBlock& block : residual_up_blocks) bodies.push_back(&block.body);
  return bodies;
}

namespace {

// The decoder's widths: dims[0] for conv_in and the mid block, then up block i maps
// in_i -> dims[i + 1] with in_0 = dims[0] and in_i = dims[i] / 2 (the previous upsampler halved it),
// or in_i = dims[i] with is_residual (the upsamplers keep the width).
std::vector<int64_t> decoder_dims(const AutoencoderKLWanConfig& c) {
  std::vector<int64_t> dims = {c.decoder_dim() * c.dim_mult.back()};
  for (auto it = c.dim_mult.rbegin(); it != c.dim_mult.rend(); ++it) dims.push_back(c.decoder_dim() * *it);
  return dims;
}

}  // namespace

AutoencoderKLWan::AutoencoderKLWan(AutoencoderKLWanConfig config)
    : config_(std::move(config)), modules_(std::make_unique<wan_vae::DecoderModules>()) {
  validate_autoencoder_kl_wan_config(config_, "AutoencoderKLWan");
  wan_vae::DecoderModules& m = *modules_;
  int& slots = m.cache_slots;
  int& upsamplers = m.temporal_upsamplers;
  const std::vector<int64_t> dims = decoder_dims(config_);
  const std::vector<bool> temporal = config_.temperal_upsample();
  const int64_t z = config_.z_dim;
  m.post_quant_conv.declare(table_, "post_quant_conv", z, z, {1, 1, 1}, {0, 0, 0}, slots);
  m.conv_in.declare(table_, "decoder.conv_in", z, dims[0], {3, 3, 3}, {1, 1, 1}, slots);
  m.mid_block.declare(table_, "decoder.mid_block", dims[0], slots);
  const std::size_t n = config_.dim_mult.size();
  if (config_.is_residual) m.residual_up_blocks.resize(n);
  else m.up_blocks.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::string prefix = "decoder.up_blocks." + std::to_string(i);
    const bool upsample = i + 1 < n;
    if (config_.is_residual)
      m.residual_up_blocks[i].declare(table_, prefix, dims[i], dims[i + 1], config_.num_res_blocks + 1, upsample, upsample && temporal[i],
                                      slots, upsamplers);
    else
      m.up_blocks[i].declare(table_, prefix, i == 0 ? dims[0] : dims[i] / 2, dims[i + 1], config_.num_res_blocks + 1, upsample,
                             upsample && temporal[i], slots, upsamplers);
  }
  m.norm_out.declare(table_, "decoder.norm_out", dims.back(), false);
  m.conv_out.declare(table_, "decoder.conv_out", dims.back(), config_.out_channels, {3, 3, 3}, {1, 1, 1}, slots);
}

Tensor AutoencoderKLWan::unnormalize(const Tensor& latents, const Stream& stream) const {
  const int64_t zc = config_.z_dim;
  if (!latents.defined() || latents.dim() != 5 || latents.size(1) != zc ||
      (latents.dtype() != DType::f32 && latents.dtype() != DType::bf16))
    throw Error("AutoencoderKLWan unnormalize: latents must be f32 or bf16 [B, " + std::to_string(zc) + ", T, h, w], got " +
                (latents.defined() ? latents.describe() : std::string("an undefined tensor")));
  // As WanPipeline in f32: latents / (1 / std) + mean, std and mean rounded to f32 first.
  std::vector<float> inv_std(static_cast<std::size_t>(zc)), mean(static_cast<std::size_t>(zc));
  for (std::size_t i = 0; i < inv_std.size(); ++i) {
    inv_std[i] = 1.0f / static_cast<float>(config_.latents_std[i]);
    mean[i] = static_cast<float>(config_.latents_mean[i]);
  }
  const Tensor x = latents.dtype() == DType::f32 ? latents : ops::cast(latents, DType::f32, stream);
  const Tensor scaled = ops::div(x, Tensor::from_vector(inv_std, {1, zc, 1, 1, 1}), stream);
  return ops::add(scaled, Tensor::from_vector(mean, {1, zc, 1, 1, 1}), stream);
}

wan_vae::FeatureCache AutoencoderKLWan::make_feature_cache() const {
  return wan_vae::FeatureCache(modules_->cache_slots, modules_->temporal_upsamplers);
}

Tensor AutoencoderKLWan::decode_chunk(const Tensor& z, wan_vae::FeatureCache& cache, const Stream& stream) const {
  const wan_vae::DecoderModules& m = *modules_;
  if (static_cast<int>(cache.frames.size()) != m.cache_slots || static_cast<int>(cache.started.size()) != m.temporal_upsamplers)
    throw Error("AutoencoderKLWan decode_chunk: the feature cache was not made by this decoder's make_feature_cache()");
  Tensor x = m.post_quant_conv(z, cache, stream);
  x = m.conv_in(x, cache, stream);
  // Each block takes x over, so no activation outlives its last use.
  x = m.mid_block(std::move(x), cache, stream);
  for (const wan_vae::UpBlock& block : m.up_blocks) x = block(std::move(x), cache, stream);
  for (const wan_vae::ResidualUpBlock& block : m.residual_up_blocks) x = block(std::move(x), cache, stream);
  x = m.norm_out(x, stream, true);
  cache.pace(stream);
  x = m.conv_out(x, cache, stream);
  return config_.patch_size > 1 ? wan_vae::unpatchify(x, config_.patch_size, stream) : x;
}

void AutoencoderKLWan::decode_frames(const Tensor& z, const std::function<void(const Tensor& frames)>& sink,
                                     const WanDecodeOptions& options, const Stream& stream) const {
  const int64_t zc = config_.z_dim;
  if (!z.defined() || z.dim() != 5 || z.size(1) != zc || z.size(2) < 1 || z.size(3) < 1 || z.size(4) < 1 ||
      (z.dtype() != DType::f32 && z.dtype() != DType::bf16))
    throw Error("AutoencoderKLWan decode: z must be an f32 or bf16 latent [B, " + std::to_string(zc) +
                ", T, h, w] with T, h, w >= 1, got " + (z.defined() ? z.describe() : std::string("an undefined tensor")));
  if (options.latent_frames_per_chunk < 0)
    throw Error("AutoencoderKLWan decode: latent_frames_per_chunk must be >= 1 (or 0 for the whole sequence), got " +
                std::to_string(options.latent_frames_per_chunk));
  if (!sink) throw Error("AutoencoderKLWan decode_frames: no sink given");
  const Tensor x = z.dtype() == DType::f32 ? z : ops::cast(z, DType::f32, stream);
  const int64_t frames = x.size(2);
  const int64_t chunk = options.latent_frames_per_chunk == 0 ? frames : options.latent_frames_per_chunk;
  wan_vae::FeatureCache cache = make_feature_cache();
  cache.rows = options.rows;
  const Tensor band = options.rows ? options.rows->own_rows(x, stream) : x;
  for (int64_t start = 0; start < frames; start += chunk) {
    Tensor video = decode_chunk(band.narrow(2, start, std::min(chunk, frames - start)), cache, stream);
    if (options.rows) video = options.rows->gather(video, stream);
    // Clamping would turn an inf into a saturated colour: check first (a NaN or inf VAE weight).
    if (options.clamp)
      require_finite(video, "AutoencoderKLWan decode: latent frame " + std::to_string(start) +
                                " decodes to non-finite values before the clamp (a VAE weight or setting gives NaN or inf)");
    sink(options.clamp ? ops::clamp(video, -1.0f, 1.0f, stream) : video);
  }
}

Tensor AutoencoderKLWan::decode(const Tensor& z, const WanDecodeOptions& options, const Stream& stream) const {
  std::vector<Tensor> chunks;
  decode_frames(
      z, [&](const Tensor& frames) { chunks.push_back(frames); }, options, stream);
  return chunks.size() == 1 ? chunks.front() : ops::concat(chunks, 2, stream);
}

int64_t AutoencoderKLWan::feature_cache_bytes(int64_t batch, int64_t latent_h, int64_t latent_w) const {
  const wan_vae::DecoderModules& m = *modules_;
  int64_t total = 0, h = latent_h, w = latent_w;
  const auto add = [&](const wan_vae::CausalConv3d& conv) {
    if (conv.slot >= 0) total += 4 * batch * conv.in * conv.context() * h * w;
  };
  const auto add_resnet = [&](const wan_vae::ResidualBlock& r) {
    add(r.conv1);
    add(r.conv2);
  };
  add(m.conv_in);
  add_resnet(m.mid_block.resnet0);
  add_resnet(m.mid_block.resnet1);
  for (const wan_vae::UpBlock* block : m.up_block_bodies()) {
    for (const wan_vae::ResidualBlock& r : block->resnets) add_resnet(r);
    if (block->has_upsampler) {
      if (block->upsampler.mode == wan_vae::Resample::Mode::upsample3d) add(block->upsampler.time_conv);
      h *= 2;
      w *= 2;
    }
  }
  add(m.conv_out);
  return total;
}

int64_t AutoencoderKLWan::estimate_peak_bytes(int64_t batch, int64_t latent_h, int64_t latent_w) const {
  // The largest activation of one chunk (one latent frame -> temporal_upscale frames): the widest
  // tensor at each resolution, times the frames it has there. The widths come from
  // decoder_base_dim; with is_residual the upsamplers keep them, so each level's output (and its
  // shortcut's) is the next level's input, counted there.
  const std::vector<int64_t> dims = decoder_dims(config_);
  const std::vector<const wan_vae::UpBlock*> blocks = modules_->up_block_bodies();
  int64_t largest = 0, shortcut_input = 0, h = latent_h, w = latent_w, frames = 1;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const wan_vae::UpBlock& block = *blocks[i];
    const int64_t in = block.resnets.empty() ? int64_t{0} : block.resnets.front().conv1.in;
    largest = std::max(largest, 4 * batch * std::max(in, dims[i + 1]) * frames * h * w);
    // A residual up block keeps its input for the shortcut while it runs.
    if (config_.is_residual && block.has_upsampler) shortcut_input = std::max(shortcut_input, 4 * batch * in * frames * h * w);
    if (block.has_upsampler) {
      if (block.upsampler.mode == wan_vae::Resample::Mode::upsample3d) frames *= 2;
      // The time conv's doubled output and the nearest-upsampled frame.
      largest = std::max(largest, 4 * batch * 2 * dims[i + 1] * frames * h * w / 2);
      h *= 2;
      w *= 2;
    }
  }
  // A conv step of a residual block holds its input (for the residual), the conv's input (the
  // SiLU output), the padded copy (frames + 2), the conv's output and the new cache frames: about
  // 5 of the largest activations (the host waits after each step), 6 with the allocator's size
  // classes (also more than a shortcut's sum: the upsampled frames, DupUp3D's two copies and the
  // sum, or conv_out's output and its unpatchified copy); plus the shortcut's kept input, the
  // caches and the GEMM's packing workspace (a few MiB per thread).
  constexpr int64_t kGemmWorkspace = int64_t{64} << 20;
  return feature_cache_bytes(batch, latent_h, latent_w) + 6 * largest + shortcut_input + kGemmWorkspace;
}

AutoencoderKLWan load_autoencoder_kl_wan(const std::string& dir, DType dtype, const std::string& variant) {
  AutoencoderKLWan model(AutoencoderKLWanConfig::load(dir + "/config.json"));
  LoadOptions options;
  options.unexpected_prefixes = {"decoder.", "post_quant_conv."};  // encoder.* and quant_conv.* are the encoder's
  load_parameters(model.parameters(), open_component_weights(dir, variant), dtype, options);
  return model;
}

}  // namespace cubevec::models
