#include "models/autoencoder_kl.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "models/component.h"
#include "ops/attention.h"
#include "ops/vector_ops.h"
#include "base/error.h"
#include "base/config_reader.h"
#include "base/strict_json.h"

namespace cubevec::models {

// --- config -------------------------------------------------------------------------------------

// What the decoder and the encoder need of any config, however it was made.
void validate_autoencoder_kl_config(const AutoencoderKLConfig& c, const std::string& source) {
  const auto positive = [&](int64_t v, const char* key) {
    if (v < 1) throw Error(source + ": '" + key + "' must be >= 1, got " + std::to_string(v));
  };
  positive(c.in_channels, "in_channels");
  positive(c.out_channels, "out_channels");
  positive(c.latent_channels, "latent_channels");
  positive(c.norm_num_groups, "norm_num_groups");
  positive(c.sample_size, "sample_size");
  if (c.layers_per_block < 0) throw Error(source + ": 'layers_per_block' must be >= 0, got " + std::to_string(c.layers_per_block));
  if (c.block_out_channels.empty() || c.block_out_channels.size() > 16)
    throw Error(source + ": 'block_out_channels' must list 1 to 16 channel counts, got " + std::to_string(c.block_out_channels.size()));
  for (int64_t ch : c.block_out_channels)
    if (ch < 1 || ch % c.norm_num_groups != 0)
      throw Error(source + ": every 'block_out_channels' entry must be a positive multiple of norm_num_groups " +
                  std::to_string(c.norm_num_groups) + " (GroupNorm), got " + std::to_string(ch));
  if (c.act_fn != "silu") throw Error(source + ": 'act_fn' '" + c.act_fn + "' is not supported (the decoder supports \"silu\")");
  // Latents are divided by it: a tiny factor (1e-308) turns them into infinities.
  if (!std::isfinite(c.scaling_factor) || !(std::fabs(c.scaling_factor) >= 1e-6 && std::fabs(c.scaling_factor) <= 1e6))
    throw Error(source + ": 'scaling_factor' must be a finite number of magnitude in [1e-6, 1e6], got " +
                number_for_message(c.scaling_factor));
  // Added to every latent: 1e308 passes as finite but overflows the decoder to a black picture.
  if (!(std::fabs(c.shift_factor) <= 1e6))
    throw Error(source + ": 'shift_factor' must be a finite number in [-1e6, 1e6], got " + number_for_message(c.shift_factor));
}

AutoencoderKLConfig AutoencoderKLConfig::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "AutoencoderKL");
  r.expect_class({"AutoencoderKL"});
  AutoencoderKLConfig c;
  std::vector<std::string> up_block_types, down_block_types;
  std::vector<double> latents_mean, latents_std;  // only pipelines read them
  bool force_upcast = true;
  // sample_size: an int, or a list whose first entry diffusers uses for tiling.
  if (r.has("sample_size") && r.raw("sample_size").is_array()) {
    std::vector<int64_t> sizes;
    r.integers("sample_size", sizes, 1);
    c.sample_size = sizes.front();
  } else {
    r.integer("sample_size", c.sample_size, 1);
  }
  std::string act_fn = c.act_fn;
  r.integer("in_channels", c.in_channels, 1)
      .integer("out_channels", c.out_channels, 1)
      .integer("latent_channels", c.latent_channels, 1)
      .integers("block_out_channels", c.block_out_channels, 1)
      .integer("layers_per_block", c.layers_per_block, 0)
      .integer("norm_num_groups", c.norm_num_groups, 1)
      .number("scaling_factor", c.scaling_factor)
      .number("shift_factor", c.shift_factor)
      .boolean("use_quant_conv", c.use_quant_conv)
      .boolean("use_post_quant_conv", c.use_post_quant_conv)
      .boolean("mid_block_add_attention", c.mid_block_add_attention)
      .text("act_fn", act_fn)
      .texts("up_block_types", up_block_types)
      .texts("down_block_types", down_block_types)  // the encoder's; checked for type only
      .boolean("force_upcast", force_upcast)
      .numbers("latents_mean", latents_mean)
      .numbers("latents_std", latents_std);
  r.reject_unknown();
  r.require({"out_channels", "latent_channels", "block_out_channels", "layers_per_block", "norm_num_groups", "scaling_factor"});
  std::transform(act_fn.begin(), act_fn.end(), act_fn.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (act_fn != "silu" && act_fn != "swish") r.fail("act_fn", "\"" + act_fn + "\" is not supported (the decoder supports \"silu\")");
  c.act_fn = "silu";
  if (r.has("up_block_types")) {
    if (up_block_types.size() != c.block_out_channels.size())
      r.fail("up_block_types", "has " + std::to_string(up_block_types.size()) + " entries but 'block_out_channels' has " +
                                   std::to_string(c.block_out_channels.size()));
    for (const std::string& type : up_block_types)
      if (type != "UpDecoderBlock2D")
        r.fail("up_block_types", "entry \"" + type + "\" is not supported (the decoder supports \"UpDecoderBlock2D\")");
  }
  if (r.has("down_block_types")) {
    if (down_block_types.size() != c.block_out_channels.size())
      r.fail("down_block_types", "has " + std::to_string(down_block_types.size()) + " entries but 'block_out_channels' has " +
                                     std::to_string(c.block_out_channels.size()));
    for (const std::string& type : down_block_types)
      if (type != "DownEncoderBlock2D")
        r.fail("down_block_types", "entry \"" + type + "\" is not supported (the encoder supports \"DownEncoderBlock2D\")");
  }
  validate_autoencoder_kl_config(c, source);
  return c;
}

AutoencoderKLConfig AutoencoderKLConfig::load(const std::string& config_path) {
  const nlohmann::json json = read_json_file(config_path);
  return from_json(json, config_path);
}

AutoencoderKLConfig AutoencoderKLConfig::flux() {
  AutoencoderKLConfig c;
  c.in_channels = 3;
  c.out_channels = 3;
  c.latent_channels = 16;
  c.block_out_channels = {128, 256, 512, 512};
  c.layers_per_block = 2;
  c.norm_num_groups = 32;
  c.sample_size = 1024;
  c.scaling_factor = 0.3611;
  c.shift_factor = 0.1159;
  c.use_quant_conv = false;
  c.use_post_quant_conv = false;
  c.mid_block_add_attention = true;
  return c;
}

// --- blocks -------------------------------------------------------------------------------------

namespace vae {

namespace {
constexpr float kEps = 1e-6f;  // every GroupNorm of the decoder
}

void GroupNorm::declare(ParameterTable& table, const std::string& name, int64_t channels, int64_t num_groups) {
  groups = num_groups;
  eps = kEps;
  weight.declare(table, name + ".weight", channels);
  bias.declare(table, name + ".bias", channels);
}

Tensor GroupNorm::operator()(const Tensor& x, const Stream& stream, bool silu) const {
  return silu ? ops::group_norm_silu(x, groups, weight.value, bias.value, eps, stream)
              : ops::group_norm(x, groups, weight.value, bias.value, eps, stream);
}

void ResnetBlock2D::declare(ParameterTable& table, const std::string& prefix, int64_t in, int64_t out, int64_t groups) {
  norm1.declare(table, prefix + ".norm1", in, groups);
  conv1.declare(table, prefix + ".conv1", in, out, 3, 1, 1);
  norm2.declare(table, prefix + ".norm2", out, groups);
  conv2.declare(table, prefix + ".conv2", out, out, 3, 1, 1);
  has_shortcut = in != out;
  if (has_shortcut) conv_shortcut.declare(table, prefix + ".conv_shortcut", in, out, 1);
}

Tensor ResnetBlock2D::operator()(const Tensor& x, const Stream& stream) const {
  const Tensor h = conv1(norm1(x, stream, true), stream);
  // The skip connection is added as conv2 stores its output (no separate add, no extra tensor).
  return conv2.with_residual(norm2(h, stream, true), has_shortcut ? conv_shortcut(x, stream) : x, stream);
}

void Attention::declare(ParameterTable& table, const std::string& prefix, int64_t num_channels, int64_t groups) {
  channels = num_channels;
  group_norm.declare(table, prefix + ".group_norm", channels, groups);
  to_q.declare(table, prefix + ".to_q", channels, channels);
  to_k.declare(table, prefix + ".to_k", channels, channels);
  to_v.declare(table, prefix + ".to_v", channels, channels);
  to_out.declare(table, prefix + ".to_out.0", channels, channels);
}

Tensor Attention::operator()(const Tensor& x_in, const Stream& stream) const {
  const Tensor x = ops::contiguous(x_in, stream);
  const int64_t b = x.size(0), c = x.size(1), hw = x.size(2) * x.size(3);
  // GroupNorm in NCHW, then the positions as tokens [B, HW, C].
  const Tensor tokens = ops::contiguous(group_norm(x, stream).reshape({b, c, hw}).transpose(1, 2), stream);
  const auto heads = [&](const Linear& proj) { return proj(tokens, stream).reshape({b, hw, 1, c}); };
  // One head of width C in BSND; the default scale is C^-0.5.
  const Tensor a = ops::attention_forward(heads(to_q), heads(to_k), heads(to_v), {}, stream);
  const Tensor o = to_out(a.reshape({b, hw, c}), stream);  // [B, HW, C]
  return ops::add(x.reshape({b, c, hw}), o.transpose(1, 2), stream).reshape(x.shape());
}

void Upsample2D::declare(ParameterTable& table, const std::string& prefix, int64_t channels) {
  conv.declare(table, prefix + ".conv", channels, channels, 3, 1, 1);
}

Tensor Upsample2D::operator()(const Tensor& x, const Stream& stream) const { return conv(ops::upsample_nearest2d(x, 2, stream), stream); }

void MidBlock::declare(ParameterTable& table, const std::string& prefix, int64_t channels, int64_t groups, bool add_attention) {
  resnet0.declare(table, prefix + ".resnets.0", channels, channels, groups);
  has_attention = add_attention;
  if (has_attention) attention.declare(table, prefix + ".attentions.0", channels, groups);
  resnet1.declare(table, prefix + ".resnets.1", channels, channels, groups);
}

Tensor MidBlock::operator()(const Tensor& x, const Stream& stream) const {
  Tensor h = resnet0(x, stream);
  if (has_attention) h = attention(h, stream);
  return resnet1(h, stream);
}

void UpDecoderBlock::declare(ParameterTable& table, const std::string& prefix, int64_t in, int64_t out, int64_t num_resnets,
                             bool add_upsample, int64_t groups) {
  resnets.resize(static_cast<std::size_t>(num_resnets));
  for (std::size_t j = 0; j < resnets.size(); ++j)
    resnets[j].declare(table, prefix + ".resnets." + std::to_string(j), j == 0 ? in : out, out, groups);
  has_upsampler = add_upsample;
  if (has_upsampler) upsampler.declare(table, prefix + ".upsamplers.0", out);
}

Tensor UpDecoderBlock::operator()(const Tensor& x, const Stream& stream) const {
  Tensor h = x;
  for (const ResnetBlock2D& resnet : resnets) h = resnet(h, stream);
  return has_upsampler ? upsampler(h, stream) : h;
}

// --- tiling -------------------------------------------------------------------------------------

Tensor decode_in_tiles(const Tensor& z, int64_t tile, int64_t overlap, int64_t upscale,
                       const std::function<Tensor(const Tensor&)>& decode_tile, const Stream& stream) {
  if (!z.defined() || z.dim() != 4 || z.size(2) < 1 || z.size(3) < 1)
    throw Error("decode_in_tiles: z must be [B, C, H, W] with H, W >= 1, got " +
                (z.defined() ? shape_to_string(z.shape()) : std::string("an undefined tensor")));
  if (tile < 1 || overlap < 0 || overlap >= tile)
    throw Error("decode_in_tiles: need a tile size >= 1 and 0 <= overlap < tile, got tile " + std::to_string(tile) + " and overlap " +
                std::to_string(overlap));
  if (upscale < 1) throw Error("decode_in_tiles: upscale must be >= 1, got " + std::to_string(upscale));
  if (!decode_tile) throw Error("decode_in_tiles: no tile decoder given");
  const int64_t batch = z.size(0), height = z.size(2), width = z.size(3), step = tile - overlap;
  const int64_t blend = upscale * overlap, keep = upscale * step;
  Tensor out;
  std::vector<Tensor> above, current;  // the blended tiles of the previous and the current row
  for (int64_t i = 0; i < height; i += step) {
    current.clear();
    for (int64_t j = 0; j < width; j += step) {
      const int64_t th = std::min(tile, height - i), tw = std::min(tile, width - j);
      Tensor decoded = decode_tile(z.narrow(2, i, th).narrow(3, j, tw));
      int64_t channels = out.defined() ? out.size(1) : -1;  // the first tile sets the channel count
      if (!out.defined() && decoded.defined() && decoded.dim() == 4) channels = decoded.size(1);
      const Shape want = {batch, channels, upscale * th, upscale * tw};
      if (!decoded.defined() || decoded.dtype() != DType::f32 || decoded.shape() != want)
        throw Error("decode_in_tiles: the tile decoder must return f32 " + shape_to_string(want) + " for the tile at (" +
                    std::to_string(i) + ", " + std::to_string(j) + "), got " +
                    (decoded.defined() ? decoded.describe() : std::string("an undefined tensor")));
      if (!decoded.is_contiguous()) decoded = ops::contiguous(decoded, stream);
      if (!out.defined()) out = stream.device().empty({batch, channels, upscale * height, upscale * width}, DType::f32, stream);
      const std::size_t col = current.size();
      current.push_back(ops::blend_tile(decoded, i > 0 ? above[col] : Tensor(), col > 0 ? current[col - 1] : Tensor(), blend, out,
                                        upscale * i, upscale * j, keep, stream));
    }
    above.swap(current);
  }
  return out;
}

}  // namespace vae

// --- the decoder --------------------------------------------------------------------------------

AutoencoderKLDecoder::AutoencoderKLDecoder(AutoencoderKLConfig config)
    : config_(std::move(config)), modules_(std::make_unique<vae::DecoderModules>()) {
  validate_autoencoder_kl_config(config_, "AutoencoderKLDecoder");
  vae::DecoderModules& m = *modules_;
  const std::vector<int64_t>& channels = config_.block_out_channels;
  const int64_t groups = config_.norm_num_groups, latent = config_.latent_channels;
  m.has_post_quant_conv = config_.use_post_quant_conv;
  if (m.has_post_quant_conv) m.post_quant_conv.declare(table_, "post_quant_conv", latent, latent, 1);
  m.conv_in.declare(table_, "decoder.conv_in", latent, channels.back(), 3, 1, 1);
  m.mid_block.declare(table_, "decoder.mid_block", channels.back(), groups, config_.mid_block_add_attention);
  // The up blocks run the channel counts in reverse; all but the last upsample.
  const std::size_t n = channels.size();
  m.up_blocks.resize(n);
  int64_t previous = channels.back();
  for (std::size_t i = 0; i < n; ++i) {
    const int64_t out = channels[n - 1 - i];
    m.up_blocks[i].declare(table_, "decoder.up_blocks." + std::to_string(i), previous, out, config_.layers_per_block + 1, i + 1 < n,
                           groups);
    previous = out;
  }
  m.conv_norm_out.declare(table_, "decoder.conv_norm_out", channels.front(), groups);
  m.conv_out.declare(table_, "decoder.conv_out", channels.front(), config_.out_channels, 3, 1, 1);
}

Tensor AutoencoderKLDecoder::decode(const Tensor& z, const Stream& stream) const {
  if (!z.defined() || z.dim() != 4 || z.size(1) != config_.latent_channels || (z.dtype() != DType::f32 && z.dtype() != DType::bf16))
    throw Error("AutoencoderKL decode: z must be an f32 or bf16 latent [B, " + std::to_string(config_.latent_channels) + ", h, w], got " +
                (z.defined() ? z.describe() : std::string("an undefined tensor")));
  const vae::DecoderModules& m = *modules_;
  Tensor x = z.dtype() == DType::f32 ? z : ops::cast(z, DType::f32, stream);
  if (m.has_post_quant_conv) x = m.post_quant_conv(x, stream);
  x = m.conv_in(x, stream);
  x = m.mid_block(x, stream);
  for (const vae::UpDecoderBlock& block : m.up_blocks) x = block(x, stream);
  return m.conv_out(m.conv_norm_out(x, stream, true), stream);
}

namespace {

// diffusers' 25% tile overlap: tile - floor(0.75 tile) latent pixels.
int64_t default_overlap(int64_t tile) { return tile - (3 * tile) / 4; }

}  // namespace

Tensor AutoencoderKLDecoder::decode_tiled(const Tensor& z, const TileOptions& options, const Stream& stream) const {
  if (options.tile_latent_size < 0)
    throw Error("AutoencoderKL decode_tiled: tile_latent_size must be >= 1 (or 0 for the config's), got " +
                std::to_string(options.tile_latent_size));
  const int64_t tile = options.tile_latent_size > 0 ? options.tile_latent_size : config_.tile_latent_size();
  if (tile < 1)
    throw Error("AutoencoderKL decode_tiled: the config's tile size, sample_size " + std::to_string(config_.sample_size) + " / upscale " +
                std::to_string(config_.upscale()) + ", is 0 latent pixels; give TileOptions::tile_latent_size");
  const int64_t overlap = options.overlap_latent >= 0 ? options.overlap_latent : default_overlap(tile);
  if (options.overlap_latent < -1 || overlap >= tile)
    throw Error("AutoencoderKL decode_tiled: the overlap must be in [0, tile size " + std::to_string(tile) + ") latent pixels, got " +
                std::to_string(options.overlap_latent));
  // As diffusers: a latent that fits in one tile is decoded whole (and a malformed z gets decode's message).
  if (!z.defined() || z.dim() != 4 || (z.size(2) <= tile && z.size(3) <= tile)) return decode(z, stream);
  if (!options.sharing || options.sharing->ranks() == 1)
    return vae::decode_in_tiles(
        z, tile, overlap, config_.upscale(), [&](const Tensor& t) { return decode(t, stream); }, stream);
  // Patch parallel: this rank decodes its tiles (in decode_in_tiles' row-major order) first, then
  // decode_in_tiles blends every rank's tiles as they are shared.
  const TileSharing& sharing = *options.sharing;
  const int64_t step = tile - overlap, upscale = config_.upscale();
  std::vector<Tensor> mine;
  for (int64_t i = 0, k = 0; i < z.size(2); i += step)
    for (int64_t j = 0; j < z.size(3); j += step, ++k)
      mine.push_back(k % sharing.ranks() != sharing.rank()
                         ? Tensor()
                         : decode(z.narrow(2, i, std::min(tile, z.size(2) - i)).narrow(3, j, std::min(tile, z.size(3) - j)), stream));
  std::size_t next = 0;
  return vae::decode_in_tiles(
      z, tile, overlap, upscale,
      [&](const Tensor& t) {
        const std::size_t k = next++;
        const Shape shape = {t.size(0), config_.out_channels, upscale * t.size(2), upscale * t.size(3)};
        return sharing.share(mine.at(k), static_cast<int64_t>(k), static_cast<int>(k % static_cast<std::size_t>(sharing.ranks())), shape,
                             stream);
      },
      stream);
}

int64_t AutoencoderKLDecoder::tile_count(int64_t latent_h, int64_t latent_w) const {
  const int64_t tile = config_.tile_latent_size();
  if (tile < 1 || (latent_h <= tile && latent_w <= tile)) return 1;
  const int64_t step = tile - default_overlap(tile);
  return ((latent_h + step - 1) / step) * ((latent_w + step - 1) / step);
}

AutoencoderKLDecoder load_autoencoder_kl(const std::string& dir, DType dtype, const std::string& variant) {
  AutoencoderKLDecoder model(AutoencoderKLConfig::load(dir + "/config.json"));
  LoadOptions options;
  options.unexpected_prefixes = {"decoder.", "post_quant_conv."};  // encoder.* and quant_conv.* are the encoder's
  load_parameters(model.parameters(), open_component_weights(dir, variant), dtype, options);
  return model;
}

}  // namespace cubevec::models
