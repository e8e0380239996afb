// The AutoencoderKL decoder: config parsing, diffusers weight names, every block and the whole
// decode against plain double-precision loops written here, diffusers' tiled decode (its blending
// re-implemented here over plain arrays), the loader, and simulate mode.
#include "models/autoencoder_kl.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>

#include "common/temp_dir.h"
#include "common/tensor_testing.h"
#include "ops/vector_ops.h"
#include "tensor/safetensors.h"

namespace cubevec {
namespace autoencoder_kl_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using models::AutoencoderKLConfig;
using models::AutoencoderKLDecoder;

// --- plain-loop reference -------------------------------------------------------------------------

// An NCHW image in double.
struct Img {
  int64_t n = 0, c = 0, h = 0, w = 0;
  std::vector<double> v;
  Img(int64_t n_, int64_t c_, int64_t h_, int64_t w_) : n(n_), c(c_), h(h_), w(w_), v(static_cast<std::size_t>(n_ * c_ * h_ * w_)) {}
  double& at(int64_t b, int64_t ch, int64_t y, int64_t x) { return v[static_cast<std::size_t>(((b * c + ch) * h + y) * w + x)]; }
  double at(int64_t b, int64_t ch, int64_t y, int64_t x) const { return v[static_cast<std::size_t>(((b * c + ch) * h + y) * w + x)]; }
};

Img img_of(const Tensor& t) {
  Img out(t.size(0), t.size(1), t.size(2), t.size(3));
  out.v = values(t);
  return out;
}

// Direct convolution, stride 1, zero padding, weight [O, C, k, k] and bias from the layer.
Img ref_conv(const Img& x, const models::Conv2d& conv) {
  const std::vector<double> w = values(conv.weight), b = values(conv.bias);
  const int64_t k = conv.kernel, pad = conv.padding, o = conv.out;
  EXPECT_EQ(conv.in, x.c);
  Img y(x.n, o, x.h + 2 * pad - k + 1, x.w + 2 * pad - k + 1);
  for (int64_t n = 0; n < x.n; ++n)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t yy = 0; yy < y.h; ++yy)
        for (int64_t xx = 0; xx < y.w; ++xx) {
          double s = b[static_cast<std::size_t>(oc)];
          for (int64_t ic = 0; ic < x.c; ++ic)
            for (int64_t ky = 0; ky < k; ++ky)
              for (int64_t kx = 0; kx < k; ++kx) {
                const int64_t iy = yy - pad + ky, ix = xx - pad + kx;
                if (iy < 0 || ix < 0 || iy >= x.h || ix >= x.w) continue;
                s += x.at(n, ic, iy, ix) * w[static_cast<std::size_t>(((oc * x.c + ic) * k + ky) * k + kx)];
              }
          y.at(n, oc, yy, xx) = s;
        }
  return y;
}

// GroupNorm (biased variance, eps 1e-6) with the layer's weight and bias, then SiLU when asked.
Img ref_group_norm(const Img& x, const models::vae::GroupNorm& gn, bool silu) {
  const std::vector<double> w = values(gn.weight.value), b = values(gn.bias.value);
  const int64_t per = x.c / gn.groups;
  Img y = x;
  for (int64_t n = 0; n < x.n; ++n)
    for (int64_t g = 0; g < gn.groups; ++g) {
      double sum = 0, sq = 0;
      const double count = static_cast<double>(per * x.h * x.w);
      for (int64_t c = g * per; c < (g + 1) * per; ++c)
        for (int64_t i = 0; i < x.h * x.w; ++i) sum += x.at(n, c, i / x.w, i % x.w);
      const double mean = sum / count;
      for (int64_t c = g * per; c < (g + 1) * per; ++c)
        for (int64_t i = 0; i < x.h * x.w; ++i) sq += std::pow(x.at(n, c, i / x.w, i % x.w) - mean, 2);
      const double rstd = 1.0 / std::sqrt(sq / count + 1e-6);
      for (int64_t c = g * per; c < (g + 1) * per; ++c)
        for (int64_t i = 0; i < x.h * x.w; ++i) {
          double& v = y.at(n, c, i / x.w, i % x.w);
          v = (v - mean) * rstd * w[static_cast<std::size_t>(c)] + b[static_cast<std::size_t>(c)];
          if (silu) v = v / (1.0 + std::exp(-v));
        }
    }
  return y;
}

Img ref_add(Img a, const Img& b) {
  for (std::size_t i = 0; i < a.v.size(); ++i) a.v[i] += b.v[i];
  return a;
}

Img ref_resnet(const Img& x, const models::vae::ResnetBlock2D& r) {
  const Img h = ref_conv(ref_group_norm(ref_conv(ref_group_norm(x, r.norm1, true), r.conv1), r.norm2, true), r.conv2);
  return ref_add(r.has_shortcut ? ref_conv(x, r.conv_shortcut) : x, h);
}

// tokens [T, C] x W^T + b for a Linear [C, C].
std::vector<double> ref_linear(const std::vector<double>& t, int64_t tokens, const models::Linear& l) {
  const std::vector<double> w = values(l.weight), b = values(l.bias);
  std::vector<double> out(static_cast<std::size_t>(tokens * l.out));
  for (int64_t i = 0; i < tokens; ++i)
    for (int64_t o = 0; o < l.out; ++o) {
      double s = b[static_cast<std::size_t>(o)];
      for (int64_t k = 0; k < l.in; ++k) s += t[static_cast<std::size_t>(i * l.in + k)] * w[static_cast<std::size_t>(o * l.in + k)];
      out[static_cast<std::size_t>(i * l.out + o)] = s;
    }
  return out;
}

Img ref_attention(const Img& x, const models::vae::Attention& a) {
  const Img g = ref_group_norm(x, a.group_norm, false);
  const int64_t hw = x.h * x.w, c = x.c;
  Img out = x;
  for (int64_t n = 0; n < x.n; ++n) {
    std::vector<double> t(static_cast<std::size_t>(hw * c));
    for (int64_t i = 0; i < hw; ++i)
      for (int64_t ch = 0; ch < c; ++ch) t[static_cast<std::size_t>(i * c + ch)] = g.at(n, ch, i / x.w, i % x.w);
    const auto q = ref_linear(t, hw, a.to_q), k = ref_linear(t, hw, a.to_k), v = ref_linear(t, hw, a.to_v);
    std::vector<double> o(t.size());
    for (int64_t i = 0; i < hw; ++i) {
      std::vector<double> p(static_cast<std::size_t>(hw));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j < hw; ++j) {
        double s = 0;
        for (int64_t d = 0; d < c; ++d) s += q[static_cast<std::size_t>(i * c + d)] * k[static_cast<std::size_t>(j * c + d)];
        p[static_cast<std::size_t>(j)] = s / std::sqrt(static_cast<double>(c));
        mx = std::max(mx, p[static_cast<std::size_t>(j)]);
      }
      for (double& e : p) sum += (e = std::exp(e - mx));
      for (int64_t d = 0; d < c; ++d) {
        double s = 0;
        for (int64_t j = 0; j < hw; ++j) s += p[static_cast<std::size_t>(j)] * v[static_cast<std::size_t>(j * c + d)];
        o[static_cast<std::size_t>(i * c + d)] = s / sum;
      }
    }
    const auto proj = ref_linear(o, hw, a.to_out);
    for (int64_t i = 0; i < hw; ++i)
      for (int64_t ch = 0; ch < c; ++ch) out.at(n, ch, i / x.w, i % x.w) += proj[static_cast<std::size_t>(i * c + ch)];
  }
  return out;
}

Img ref_upsample(const Img& x, int64_t s) {
  Img y(x.n, x.c, x.h * s, x.w * s);
  for (int64_t n = 0; n < x.n; ++n)
    for (int64_t c = 0; c < x.c; ++c)
      for (int64_t yy = 0; yy < y.h; ++yy)
        for (int64_t xx = 0; xx < y.w; ++xx) y.at(n, c, yy, xx) = x.at(n, c, yy / s, xx / s);
  return y;
}

Img ref_decode(const Img& z, const AutoencoderKLDecoder& dec) {
  const auto& m = dec.modules();
  Img x = m.has_post_quant_conv ? ref_conv(z, m.post_quant_conv) : z;
  x = ref_conv(x, m.conv_in);
  x = ref_resnet(x, m.mid_block.resnet0);
  if (m.mid_block.has_attention) x = ref_attention(x, m.mid_block.attention);
  x = ref_resnet(x, m.mid_block.resnet1);
  for (const auto& block : m.up_blocks) {
    for (const auto& r : block.resnets) x = ref_resnet(x, r);
    if (block.has_upsampler) x = ref_conv(ref_upsample(x, 2), block.upsampler.conv);
  }
  return ref_conv(ref_group_norm(x, m.conv_norm_out, true), m.conv_out);
}

// |got - want| <= rel * max|want| everywhere.
void expect_close_scaled(const Tensor& got, const std::vector<double>& want, double rel, const std::string& what) {
  const std::vector<double> g = values(got);
  ASSERT_EQ(g.size(), want.size()) << what;
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  ASSERT_GT(scale, 0.0) << what;
  for (std::size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], want[i], rel * scale) << what << " at " << i << " (max |want| " << scale << ")";
}

// diffusers' tiled_decode written over plain arrays: every tile decoded first, then blended in
// place with its (already blended) upper and left neighbours, cropped and concatenated.
Img ref_tiled(const Img& z, int64_t tile, int64_t overlap, int64_t up, const std::function<Img(const Img&)>& decode) {
  const int64_t step = tile - overlap, blend = up * overlap, limit = up * step;
  std::vector<std::vector<Img>> rows;
  for (int64_t i = 0; i < z.h; i += step) {
    rows.emplace_back();
    for (int64_t j = 0; j < z.w; j += step) {
      Img t(z.n, z.c, std::min(tile, z.h - i), std::min(tile, z.w - j));
      for (int64_t n = 0; n < z.n; ++n)
        for (int64_t c = 0; c < z.c; ++c)
          for (int64_t y = 0; y < t.h; ++y)
            for (int64_t x = 0; x < t.w; ++x) t.at(n, c, y, x) = z.at(n, c, i + y, j + x);
      rows.back().push_back(decode(t));
    }
  }
  const int64_t channels = rows.at(0).at(0).c;
  Img out(z.n, channels, up * z.h, up * z.w);
  for (std::size_t r = 0; r < rows.size(); ++r)
    for (std::size_t col = 0; col < rows[r].size(); ++col) {
      Img& b = rows[r][col];
      if (r > 0) {
        const Img& a = rows[r - 1][col];
        const int64_t e = std::min({a.h, b.h, blend});
        for (int64_t n = 0; n < b.n; ++n)
          for (int64_t c = 0; c < b.c; ++c)
            for (int64_t y = 0; y < e; ++y)
              for (int64_t x = 0; x < b.w; ++x)
                b.at(n, c, y, x) = a.at(n, c, a.h - e + y, x) * (1.0 - double(y) / double(e)) + b.at(n, c, y, x) * (double(y) / double(e));
      }
      if (col > 0) {
        const Img& a = rows[r][col - 1];
        const int64_t e = std::min({a.w, b.w, blend});
        for (int64_t n = 0; n < b.n; ++n)
          for (int64_t c = 0; c < b.c; ++c)
            for (int64_t y = 0; y < b.h; ++y)
              for (int64_t x = 0; x < e; ++x)
                b.at(n, c, y, x) = a.at(n, c, y, a.w - e + x) * (1.0 - double(x) / double(e)) + b.at(n, c, y, x) * (double(x) / double(e));
      }
      for (int64_t n = 0; n < b.n; ++n)
        for (int64_t c = 0; c < b.c; ++c)
          for (int64_t y = 0; y < std::min(limit, b.h); ++y)
            for (int64_t x = 0; x < std::min(limit, b.w); ++x)
              out.at(n, c, static_cast<int64_t>(r) * limit + y, static_cast<int64_t>(col) * limit + x) = b.at(n, c, y, x);
    }
  return out;
}

Tensor tensor_of(const Img& x) {
  std::vector<float> f(x.v.begin(), x.v.end());
  return Tensor::from_vector(f, {x.n, x.c, x.h, x.w});
}

// --- fixtures ---------------------------------------------------------------------------------------

// A tiny decoder: 3 latent channels, blocks [8, 8, 16] (the 16 -> 8 up block has a conv_shortcut),
// 4 groups, 2 resnets per up block, 4x upscale.
AutoencoderKLConfig tiny_config(bool post_quant_conv = true, bool attention = true) {
  AutoencoderKLConfig c;
  c.in_channels = 3;
  c.out_channels = 3;
  c.latent_channels = 3;
  c.block_out_channels = {8, 8, 16};
  c.layers_per_block = 1;
  c.norm_num_groups = 4;
  c.sample_size = 16;  // tile_latent_size 4
  c.scaling_factor = 0.5;
  c.use_post_quant_conv = post_quant_conv;
  c.mid_block_add_attention = attention;
  return c;
}

AutoencoderKLDecoder random_decoder(const AutoencoderKLConfig& config, uint64_t seed = 11) {
  AutoencoderKLDecoder dec(config);
  models::make_random_parameters(dec.parameters(), DType::f32, seed, 0.3f);
  return dec;
}

const char* kFluxConfig = R"({
  "_class_name": "AutoencoderKL",
  "_diffusers_version": "0.30.0.dev0",
  "act_fn": "silu",
  "block_out_channels": [128, 256, 512, 512],
  "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
  "force_upcast": true,
  "in_channels": 3,
  "latent_channels": 16,
  "latents_mean": null,
  "latents_std": null,
  "layers_per_block": 2,
  "mid_block_add_attention": true,
  "norm_num_groups": 32,
  "out_channels": 3,
  "sample_size": 1024,
  "scaling_factor": 0.3611,
  "shift_factor": 0.1159,
  "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"],
  "use_post_quant_conv": false,
  "use_quant_conv": false
})";

// Test files in a fresh temp directory.
struct TempDir : cubevec::testing::TempDir {
  TempDir() : cubevec::testing::TempDir("cubevec_vae_test") {}
};

// --- config -----------------------------------------------------------------------------------------

TEST(AutoencoderKLConfig, ParsesTheFluxVaeConfig) {
  const AutoencoderKLConfig c = AutoencoderKLConfig::from_json(nlohmann::json::parse(kFluxConfig), "flux/vae");
  const AutoencoderKLConfig f = AutoencoderKLConfig::flux();
  EXPECT_EQ(c.in_channels, 3);
  EXPECT_EQ(c.out_channels, f.out_channels);
  EXPECT_EQ(c.latent_channels, 16);
  EXPECT_EQ(c.block_out_channels, (std::vector<int64_t>{128, 256, 512, 512}));
  EXPECT_EQ(c.block_out_channels, f.block_out_channels);
  EXPECT_EQ(c.layers_per_block, 2);
  EXPECT_EQ(c.norm_num_groups, 32);
  EXPECT_EQ(c.sample_size, 1024);
  EXPECT_DOUBLE_EQ(c.scaling_factor, 0.3611);
  EXPECT_DOUBLE_EQ(c.shift_factor, 0.1159);
  EXPECT_FALSE(c.use_quant_conv);
  EXPECT_FALSE(c.use_post_quant_conv);
  EXPECT_TRUE(c.mid_block_add_attention);
  EXPECT_EQ(c.upscale(), 8);
  EXPECT_EQ(c.tile_latent_size(), 128);
  EXPECT_EQ(f.sample_size, c.sample_size);
  EXPECT_DOUBLE_EQ(f.scaling_factor, c.scaling_factor);
  EXPECT_DOUBLE_EQ(f.shift_factor, c.shift_factor);
  EXPECT_EQ(f.use_post_quant_conv, c.use_post_quant_conv);
}

TEST(AutoencoderKLConfig, OptionalKeysTakeDiffusersDefaults) {
  auto j = nlohmann::json::parse(R"({"out_channels": 3, "latent_channels": 4, "block_out_channels": [64],
                                     "layers_per_block": 1, "norm_num_groups": 32, "scaling_factor": 0.18215})");
  AutoencoderKLConfig c = AutoencoderKLConfig::from_json(j, "min");
  EXPECT_EQ(c.in_channels, 3);
  EXPECT_EQ(c.sample_size, 32);
  EXPECT_DOUBLE_EQ(c.shift_factor, 0.0);
  EXPECT_TRUE(c.use_quant_conv);
  EXPECT_TRUE(c.use_post_quant_conv);  // diffusers' code default
  EXPECT_TRUE(c.mid_block_add_attention);
  EXPECT_EQ(c.act_fn, "silu");
  EXPECT_EQ(c.upscale(), 1);
  j["shift_factor"] = nullptr;
  j["sample_size"] = {512, 512};
  j["act_fn"] = "Swish";
  c = AutoencoderKLConfig::from_json(j, "min");
  EXPECT_DOUBLE_EQ(c.shift_factor, 0.0);
  EXPECT_EQ(c.sample_size, 512);
  EXPECT_EQ(c.act_fn, "silu");
}

TEST(AutoencoderKLConfig, BadConfigsNameTheFileAndTheKey) {
  TempDir dir;
  const auto flux = nlohmann::json::parse(kFluxConfig);
  // Each edit of the Flux config and what the error must say (after the file's path).
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](auto& j) { j.erase("latent_channels"); }, ": missing required key 'latent_channels'"},
      {[](auto& j) { j.erase("block_out_channels"); }, ": missing required key 'block_out_channels'"},
      {[](auto& j) { j.erase("scaling_factor"); }, ": missing required key 'scaling_factor'"},
      {[](auto& j) { j["block_out_channels"] = "128"; }, ": 'block_out_channels' must be a non-empty list of integers in [1, 16777216]"},
      {[](auto& j) {
         j["block_out_channels"] = {128, 2.5};
       },
       ": 'block_out_channels' entry 1 must be an integer in [1, 16777216], got 2.5"},
      {[](auto& j) { j["layers_per_block"] = 2.0; }, ": 'layers_per_block' must be an integer in [0, 16777216], got 2.0"},
      {[](auto& j) { j["latent_channels"] = -16; }, ": 'latent_channels' must be an integer in [1, 16777216], got -16"},
      {[](auto& j) { j["use_post_quant_conv"] = "false"; }, ": 'use_post_quant_conv' must be true or false, got \"false\""},
      {[](auto& j) { j["mid_block_add_attention"] = 1; }, ": 'mid_block_add_attention' must be true or false, got 1"},
      {[](auto& j) { j["scaling_factor"] = "0.3611"; }, ": 'scaling_factor' must be a finite number"},
      {[](auto& j) { j["shift_factor"] = {0.1}; }, ": 'shift_factor' must be a finite number"},
      {[](auto& j) { j["shift_factor"] = 1e308; }, ": 'shift_factor' must be a finite number in [-1e6, 1e6], got 1e+308"},
      {[](auto& j) { j["scaling_factor"] = 1e-308; }, ": 'scaling_factor' must be a finite number of magnitude in [1e-6, 1e6], got 1e-308"},
      {[](auto& j) { j["act_fn"] = "gelu"; }, ": 'act_fn' \"gelu\" is not supported"},
      {[](auto& j) { j["up_block_types"][2] = "AttnUpDecoderBlock2D"; },
       ": 'up_block_types' entry \"AttnUpDecoderBlock2D\" is not supported"},
      {[](auto& j) { j["up_block_types"].erase(0); }, ": 'up_block_types' has 3 entries but 'block_out_channels' has 4"},
      {[](auto& j) {
         j["block_out_channels"] = {128, 256, 500, 512};
       },
       ": every 'block_out_channels' entry must be a positive multiple of norm_num_groups 32 (GroupNorm), got 500"},
      {[](auto& j) { j["latents_mean"] = "zero"; }, ": 'latents_mean' must be a list of finite numbers, got \"zero\""},
      {[](auto& j) { j["decoder_attention"] = true; }, ": unknown key 'decoder_attention' for AutoencoderKL"},
  };
  for (const auto& [edit, expected] : cases) {
    nlohmann::json j = flux;
    edit(j);
    const std::string path = dir.write("config.json", j.dump(2));
    const std::string msg = message_of([&] { AutoencoderKLConfig::load(path); });
    EXPECT_NE(msg.find(path + expected), std::string::npos) << "expected '" << expected << "', got: " << msg;
  }
  const std::string bad_json = dir.write("bad.json", R"({"latent_channels": 16, "latent_channels": 4})");
  std::string msg = message_of([&] { AutoencoderKLConfig::load(bad_json); });
  EXPECT_NE(msg.find(bad_json + ": not valid JSON"), std::string::npos) << msg;
  msg = message_of([&] { AutoencoderKLConfig::load((dir.path / "absent.json").string()); });
  EXPECT_NE(msg.find("absent.json: cannot open: No such file"), std::string::npos) << msg;
  // A config made in code is checked too.
  AutoencoderKLConfig c = tiny_config();
  c.act_fn = "relu";
  msg = message_of([&] { AutoencoderKLDecoder dec(c); });
  EXPECT_NE(msg.find("AutoencoderKLDecoder: 'act_fn' 'relu' is not supported"), std::string::npos) << msg;
}

// --- weights ----------------------------------------------------------------------------------------

TEST(AutoencoderKLDecoder, DeclaresDiffusersNamesAndShapes) {
  const AutoencoderKLDecoder dec(AutoencoderKLConfig::flux());
  std::map<std::string, Shape> specs;
  for (const auto& s : dec.parameters().specs()) specs[s.name] = s.shape;
  EXPECT_EQ(specs.size(), 138u);
  EXPECT_EQ(dec.parameters().numel(), 49545475);  // the Flux VAE decoder
  const std::map<std::string, Shape> expected = {
      {"decoder.conv_in.weight", {512, 16, 3, 3}},
      {"decoder.conv_in.bias", {512}},
      {"decoder.mid_block.resnets.0.norm1.weight", {512}},
      {"decoder.mid_block.resnets.1.conv2.weight", {512, 512, 3, 3}},
      {"decoder.mid_block.attentions.0.group_norm.bias", {512}},
      {"decoder.mid_block.attentions.0.to_q.weight", {512, 512}},
      {"decoder.mid_block.attentions.0.to_k.bias", {512}},
      {"decoder.mid_block.attentions.0.to_v.weight", {512, 512}},
      {"decoder.mid_block.attentions.0.to_out.0.weight", {512, 512}},
      {"decoder.mid_block.attentions.0.to_out.0.bias", {512}},
      {"decoder.up_blocks.0.resnets.2.conv1.weight", {512, 512, 3, 3}},
      {"decoder.up_blocks.0.upsamplers.0.conv.weight", {512, 512, 3, 3}},
      {"decoder.up_blocks.1.upsamplers.0.conv.bias", {512}},
      {"decoder.up_blocks.2.resnets.0.norm1.weight", {512}},
      {"decoder.up_blocks.2.resnets.0.conv1.weight", {256, 512, 3, 3}},
      {"decoder.up_blocks.2.resnets.0.conv_shortcut.weight", {256, 512, 1, 1}},
      {"decoder.up_blocks.2.resnets.0.conv_shortcut.bias", {256}},
      {"decoder.up_blocks.2.upsamplers.0.conv.weight", {256, 256, 3, 3}},
      {"decoder.up_blocks.3.resnets.0.conv_shortcut.weight", {128, 256, 1, 1}},
      {"decoder.up_blocks.3.resnets.2.conv2.weight", {128, 128, 3, 3}},
      {"decoder.conv_norm_out.weight", {128}},
      {"decoder.conv_out.weight", {3, 128, 3, 3}},
      {"decoder.conv_out.bias", {3}},
  };
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(specs.count(name)) << name;
    EXPECT_EQ(specs[name], shape) << name;
  }
  for (const char* absent : {"decoder.up_blocks.3.upsamplers.0.conv.weight", "decoder.up_blocks.1.resnets.0.conv_shortcut.weight",
                             "post_quant_conv.weight", "decoder.up_blocks.0.resnets.3.norm1.weight"})
    EXPECT_FALSE(specs.count(absent)) << absent;
  // With a post_quant_conv (SD-style configs) and without the mid attention.
  AutoencoderKLConfig c = AutoencoderKLConfig::flux();
  c.use_post_quant_conv = true;
  c.mid_block_add_attention = false;
  std::map<std::string, Shape> other;
  const AutoencoderKLDecoder sd_style(c);
  for (const auto& s : sd_style.parameters().specs()) other[s.name] = s.shape;
  EXPECT_EQ(other.size(), 138u + 2 - 10);
  EXPECT_EQ(other["post_quant_conv.weight"], (Shape{16, 16, 1, 1}));
  EXPECT_EQ(other["post_quant_conv.bias"], (Shape{16}));
  EXPECT_FALSE(other.count("decoder.mid_block.attentions.0.to_q.weight"));
}

// --- blocks against plain loops ---------------------------------------------------------------------

TEST(AutoencoderKLDecoder, ResnetBlockMatchesPlainLoops) {
  for (const bool shortcut : {true, false}) {
    models::ParameterTable table;
    models::vae::ResnetBlock2D block;
    const int64_t in = shortcut ? 12 : 8, out = 8;
    block.declare(table, "r", in, out, 4);
    EXPECT_EQ(block.has_shortcut, shortcut);
    models::make_random_parameters(table, DType::f32, 3, 0.3f);
    const Tensor x = random_tensor({2, in, 5, 7}, 4, DType::f32, 2.0f);
    const Tensor y = block(x, ops::default_op_stream());
    ASSERT_EQ(y.shape(), (Shape{2, out, 5, 7}));
    expect_close_scaled(y, ref_resnet(img_of(x), block).v, 1e-5, shortcut ? "with conv_shortcut" : "identity shortcut");
  }
}

TEST(AutoencoderKLDecoder, MidAttentionMatchesPlainLoops) {
  models::ParameterTable table;
  models::vae::Attention attention;
  attention.declare(table, "a", 16, 4);
  models::make_random_parameters(table, DType::f32, 5, 0.3f);
  const Tensor x = random_tensor({2, 16, 3, 5}, 6, DType::f32, 2.0f);
  const Tensor y = attention(x, ops::default_op_stream());
  ASSERT_EQ(y.shape(), x.shape());
  expect_close_scaled(y, ref_attention(img_of(x), attention).v, 1e-5, "mid attention");
  // A non-contiguous input gives the same result.
  expect_close_scaled(attention(strided_copy_of(x), ops::default_op_stream()), values(y), 1e-6, "strided input");
}

TEST(AutoencoderKLDecoder, DecodeMatchesPlainLoops) {
  for (const bool post_quant : {true, false})
    for (const bool attention : {true, false}) {
      const AutoencoderKLDecoder dec = random_decoder(tiny_config(post_quant, attention));
      const Tensor z = random_tensor({2, 3, 5, 3}, 8, DType::f32, 1.5f);
      const Tensor image = dec.decode(z);
      ASSERT_EQ(image.shape(), (Shape{2, 3, 20, 12}));
      ASSERT_EQ(image.dtype(), DType::f32);
      expect_close_scaled(image, ref_decode(img_of(z), dec).v, 1e-5,
                          std::string("post_quant_conv ") + (post_quant ? "on" : "off") + ", attention " + (attention ? "on" : "off"));
    }
}

TEST(AutoencoderKLDecoder, DecodeRejectsWrongLatents) {
  const AutoencoderKLDecoder dec = random_decoder(tiny_config());
  std::string msg = message_of([&] { dec.decode(random_tensor({1, 4, 5, 5}, 1)); });
  EXPECT_NE(msg.find("AutoencoderKL decode: z must be an f32 or bf16 latent [B, 3, h, w], got Tensor(f32, shape [1, 4, 5, 5]"),
            std::string::npos)
      << msg;
  msg = message_of([&] { dec.decode(random_tensor({3, 5, 5}, 1)); });
  EXPECT_NE(msg.find("z must be an f32 or bf16 latent"), std::string::npos) << msg;
  msg = message_of([&] { dec.decode_tiled(random_tensor({1, 3, 9, 9}, 1), {.tile_latent_size = 4, .overlap_latent = 4}); });
  EXPECT_NE(msg.find("the overlap must be in [0, tile size 4) latent pixels, got 4"), std::string::npos) << msg;
  msg = message_of([&] { dec.decode_tiled(random_tensor({1, 3, 9, 9}, 1), {.tile_latent_size = -2}); });
  EXPECT_NE(msg.find("tile_latent_size must be >= 1 (or 0 for the config's), got -2"), std::string::npos) << msg;
  AutoencoderKLConfig small = tiny_config();
  small.sample_size = 2;  // 2 / 4 = 0
  const AutoencoderKLDecoder no_tile = random_decoder(small);
  msg = message_of([&] { no_tile.decode_tiled(random_tensor({1, 3, 9, 9}, 1)); });
  EXPECT_NE(msg.find("sample_size 2 / upscale 4, is 0 latent pixels"), std::string::npos) << msg;
}

TEST(AutoencoderKLDecoder, Bf16WeightsStayCloseToF32) {
  const AutoencoderKLDecoder f32 = random_decoder(tiny_config());
  AutoencoderKLDecoder bf16(tiny_config());
  models::make_random_parameters(bf16.parameters(), DType::bf16, 11, 0.3f);
  const Tensor z = random_tensor({1, 3, 4, 4}, 9);
  expect_close_scaled(bf16.decode(z), values(f32.decode(z)), 0.05, "bf16 weights");
}

// --- tiled decode ----------------------------------------------------------------------------------

TEST(AutoencoderKLDecoder, TiledDecodeIsDecodeWhenOneTileCoversTheLatent) {
  const AutoencoderKLDecoder dec = random_decoder(tiny_config());
  const Tensor z = random_tensor({2, 3, 4, 3}, 12);  // <= the config's 4 x 4 tile
  const std::vector<double> whole = values(dec.decode(z));
  expect_close(dec.decode_tiled(z), whole, DType::f32, "default tile", Tolerance{0, 0});
  const Tensor big = random_tensor({1, 3, 7, 9}, 13);
  expect_close(dec.decode_tiled(big, {.tile_latent_size = 9}), values(dec.decode(big)), DType::f32, "tile 9", Tolerance{0, 0});
}

// Synthetic tile decoders, so every blend weight and placement is checked exactly against the
// plain-array version of diffusers' tiled_decode.
TEST(DecodeInTiles, BlendsLikeDiffusers) {
  struct Case {
    Shape z;
    int64_t tile, overlap, up;
  };
  // Edge tiles narrower than the blend extent, a one-column last tile, no overlap, and B, C > 1.
  const Case cases[] = {
      {{2, 2, 11, 7}, 4, 1, 2}, {{1, 3, 7, 13}, 4, 2, 3}, {{2, 1, 9, 9}, 5, 2, 4}, {{1, 2, 6, 10}, 3, 0, 2}, {{1, 1, 5, 5}, 5, 4, 1}};
  for (const Case& c : cases) {
    const std::string what =
        shape_to_string(c.z) + " tile " + std::to_string(c.tile) + " overlap " + std::to_string(c.overlap) + " up " + std::to_string(c.up);
    const Tensor z = random_tensor(c.z, 21);
    // A decoder whose output depends on the tile (a per-call offset) and on the position in it, so
    // no two overlapping tiles agree: 2 output channels per input channel.
    const auto synthetic = [up = c.up](const Img& t, int call) {
      Img out(t.n, 2 * t.c, up * t.h, up * t.w);
      for (int64_t n = 0; n < out.n; ++n)
        for (int64_t ch = 0; ch < out.c; ++ch)
          for (int64_t y = 0; y < out.h; ++y)
            for (int64_t x = 0; x < out.w; ++x)
              out.at(n, ch, y, x) = t.at(n, ch / 2, y / up, x / up) * (ch % 2 ? -1.0 : 1.0) + 10.0 * call + 0.1 * static_cast<double>(y) -
                                    0.05 * static_cast<double>(x);
      return out;
    };
    int calls = 0;
    const Tensor got = models::vae::decode_in_tiles(
        z, c.tile, c.overlap, c.up, [&](const Tensor& t) { return tensor_of(synthetic(img_of(t.contiguous()), calls++)); },
        ops::default_op_stream());
    int ref_calls = 0;
    const Img want = ref_tiled(img_of(z), c.tile, c.overlap, c.up, [&](const Img& t) { return synthetic(t, ref_calls++); });
    EXPECT_EQ(calls, ref_calls) << what;
    ASSERT_EQ(got.shape(), (Shape{want.n, want.c, want.h, want.w})) << what;
    expect_close(got, want.v, DType::f32, what, Tolerance{1e-6, 1e-5});
  }
}

TEST(DecodeInTiles, ATileIndependentDecoderHasNoSeams) {
  // Nearest upsampling decodes every tile the same way, so blending identical values changes
  // nothing (up to rounding) and the tiled result is the whole-image result.
  const Tensor z = random_tensor({2, 3, 13, 10}, 22);
  const Tensor got = models::vae::decode_in_tiles(
      z, 4, 1, 8, [](const Tensor& t) { return ops::upsample_nearest2d(t, 8); }, ops::default_op_stream());
  expect_close(got, values(ops::upsample_nearest2d(z, 8)), DType::f32, "nearest x8", Tolerance{1e-6, 1e-6});
}

TEST(AutoencoderKLDecoder, TiledDecodeBlendsPerTileDecodes) {
  const AutoencoderKLDecoder dec = random_decoder(tiny_config());
  const Tensor z = random_tensor({2, 3, 9, 6}, 23);
  const auto per_tile = [&](const Img& t) { return img_of(dec.decode(tensor_of(t))); };
  // The config's tile (sample_size 16 / upscale 4 = 4 latent pixels) and diffusers' 25% overlap (1).
  const Tensor got = dec.decode_tiled(z);
  const Img want = ref_tiled(img_of(z), 4, 1, 4, per_tile);
  ASSERT_EQ(got.shape(), (Shape{2, 3, 36, 24}));
  expect_close(got, want.v, DType::f32, "default tiling", Tolerance{1e-5, 1e-5});
  const Tensor got2 = dec.decode_tiled(z, {.tile_latent_size = 5, .overlap_latent = 2});
  expect_close(got2, ref_tiled(img_of(z), 5, 2, 4, per_tile).v, DType::f32, "tile 5 overlap 2", Tolerance{1e-5, 1e-5});
  // Tiling changes the result (GroupNorm and attention see only the tile), but not wildly.
  expect_close_scaled(got, values(dec.decode(z)), 1.0, "tiled vs whole, same scale");
}

// --- loading ----------------------------------------------------------------------------------------

// Writes config.json and a checkpoint with `dec`'s weights plus encoder tensors, edited by `edit`.
void write_vae_dir(const TempDir& dir, const AutoencoderKLDecoder& dec, const std::string& config_text,
                   const std::function<void(NamedTensors&)>& edit = {}) {
  NamedTensors tensors;
  for (const auto& s : dec.parameters().specs()) tensors.emplace_back(s.name, *s.slot);
  tensors.emplace_back("encoder.conv_in.weight", random_tensor({8, 3, 3, 3}, 1));
  tensors.emplace_back("encoder.conv_in.bias", random_tensor({8}, 2));
  tensors.emplace_back("quant_conv.weight", random_tensor({6, 6, 1, 1}, 3));
  tensors.emplace_back("quant_conv.bias", random_tensor({6}, 4));
  if (edit) edit(tensors);
  dir.write("config.json", config_text);
  write_safetensors((dir.path / "diffusion_pytorch_model.safetensors").string(), tensors);
}

std::string tiny_config_json(bool post_quant_conv) {
  return std::string(R"({"_class_name": "AutoencoderKL", "in_channels": 3, "out_channels": 3, "latent_channels": 3,
    "block_out_channels": [8, 8, 16], "layers_per_block": 1, "norm_num_groups": 4, "sample_size": 16,
    "scaling_factor": 0.5, "shift_factor": null, "use_quant_conv": true, "use_post_quant_conv": )") +
         (post_quant_conv ? "true" : "false") + "}";
}

TEST(LoadAutoencoderKL, LoadsTheDecoderAndIgnoresTheEncoder) {
  TempDir dir;
  const AutoencoderKLDecoder ref = random_decoder(tiny_config());
  write_vae_dir(dir, ref, tiny_config_json(true));
  const AutoencoderKLDecoder dec = models::load_autoencoder_kl(dir.path.string());
  EXPECT_TRUE(dec.config().use_post_quant_conv);
  const Tensor z = random_tensor({1, 3, 3, 4}, 5);
  expect_close(dec.decode(z), values(ref.decode(z)), DType::f32, "loaded", Tolerance{0, 0});
  // bf16 storage.
  const AutoencoderKLDecoder half = models::load_autoencoder_kl(dir.path.string(), DType::bf16);
  EXPECT_EQ(half.modules().conv_in.weight.dtype(), DType::bf16);
  expect_close_scaled(half.decode(z), values(ref.decode(z)), 0.05, "loaded as bf16");
}

TEST(LoadAutoencoderKL, MismatchesListDecoderNamesOnly) {
  TempDir dir;
  const AutoencoderKLDecoder ref = random_decoder(tiny_config(false));
  write_vae_dir(dir, ref, tiny_config_json(false), [](NamedTensors& t) {
    std::erase_if(
        t, [](const auto& p) { return p.first == "decoder.conv_out.bias" || p.first == "decoder.up_blocks.1.upsamplers.0.conv.weight"; });
    for (auto& [name, tensor] : t)
      if (name == "decoder.conv_in.weight") tensor = random_tensor({16, 3, 1, 1}, 6);
    t.emplace_back("decoder.up_blocks.9.resnets.0.norm1.weight", random_tensor({8}, 7));
    t.emplace_back("post_quant_conv.weight", random_tensor({3, 3, 1, 1}, 8));  // the config says none
  });
  const std::string msg = message_of([&] { models::load_autoencoder_kl(dir.path.string()); });
  for (const char* part :
       {"does not match the model", "2 missing:", "decoder.conv_out.bias [3]", "decoder.up_blocks.1.upsamplers.0.conv.weight [8, 8, 3, 3]",
        "1 mis-shaped:", "decoder.conv_in.weight: expected [16, 3, 3, 3], found [16, 3, 1, 1]",
        "2 unexpected:", "decoder.up_blocks.9.resnets.0.norm1.weight", "post_quant_conv.weight"})
    EXPECT_NE(msg.find(part), std::string::npos) << part << "\n" << msg;
  for (const char* ignored : {"encoder.conv_in", "quant_conv.bias", "\n    quant_conv.weight"})
    EXPECT_EQ(msg.find(ignored), std::string::npos) << ignored << "\n" << msg;
}

TEST(LoadParameters, WithoutPrefixesEveryUndeclaredTensorIsUnexpected) {
  TempDir dir;
  models::ParameterTable table;
  Tensor w;
  table.add("decoder.w", {2}, &w);
  const std::string path = (dir.path / "m.safetensors").string();
  write_safetensors(path, {{"decoder.w", random_tensor({2}, 1)}, {"encoder.w", random_tensor({2}, 2)}});
  const Checkpoint ckpt = Checkpoint::open(path);
  std::string msg = message_of([&] { models::load_parameters(table, ckpt); });
  EXPECT_NE(msg.find("1 unexpected:\n    encoder.w"), std::string::npos) << msg;
  models::load_parameters(table, ckpt, DType::f32, {.unexpected_prefixes = {"decoder."}});
  EXPECT_EQ(w.shape(), (Shape{2}));
}

// --- parity with the PyTorch goldens -----------------------------------------------------------------

// tests/reference/make_flux_reference.py: the decoder of docs/models.md, "AutoencoderKL decoder", in
// float64 torch on bf16-representable weights (flux_tiny/vae: Flux-like, 16 latent channels, no
// post_quant_conv; flux_tiny/vae_postquant: SD-like, with post_quant_conv), results rounded to f32.
TEST(AutoencoderKLGolden, DecodeMatchesPyTorch) {
  const std::string data = std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/";
  const SafetensorsFile goldens = SafetensorsFile::open(data + "goldens_flux.safetensors");
  for (const auto& [name, dir] :
       {std::pair<std::string, std::string>{"vae_decode", "flux_tiny/vae"}, {"vae_postquant_decode", "flux_tiny/vae_postquant"}}) {
    const auto meta = nlohmann::json::parse(goldens.metadata().at(name));
    ASSERT_EQ(meta.at("weights").get<std::string>(), dir) << name;
    const AutoencoderKLDecoder dec = models::load_autoencoder_kl(data + dir);
    EXPECT_EQ(dec.config().use_post_quant_conv, meta.at("post_quant_conv").get<bool>()) << name;
    const Tensor z = goldens.tensor(name + ".z");
    const Stream stream = ops::default_op_stream();
    // The recorded intermediates first, so a mismatch says where it starts.
    const auto& m = dec.modules();
    Tensor x = z;
    if (m.has_post_quant_conv) {
      x = m.post_quant_conv(x, stream);
      expect_close_scaled(x, values(goldens.tensor(name + ".intermediate.post_quant_conv")), 1e-5, name + " post_quant_conv");
    }
    x = m.conv_in(x, stream);
    expect_close_scaled(x, values(goldens.tensor(name + ".intermediate.decoder.conv_in")), 1e-5, name + " conv_in");
    x = m.mid_block(x, stream);
    expect_close_scaled(x, values(goldens.tensor(name + ".intermediate.decoder.mid_block")), 1e-5, name + " mid_block");
    // The image: max abs error <= 1e-4 of the output's max magnitude.
    const Tensor expected = goldens.tensor(name + ".expected");
    const Tensor image = dec.decode(z, stream);
    ASSERT_EQ(image.shape(), expected.shape()) << name;
    expect_close_scaled(image, values(expected), 1e-4, name + " image");
    // One tile covering the latent is the same decode.
    expect_close(dec.decode_tiled(z, {.tile_latent_size = std::max(z.size(2), z.size(3))}, stream), values(image), DType::f32,
                 name + " one tile", Tolerance{0, 0});
    // Stored as bf16 (the weights are bf16-representable): the convs see the same values, the
    // linears round their inputs to bf16, so only a looser match.
    const AutoencoderKLDecoder half = models::load_autoencoder_kl(data + dir, DType::bf16);
    expect_close_scaled(half.decode(z, stream), values(expected), 2e-2, name + " bf16 weights");
  }
}

// --- simulate mode ----------------------------------------------------------------------------------

TEST(AutoencoderKLDecoder, SimulatesTheFluxVaeAtFullSize) {
  Device device(builtin_cpu_profile(), {.simulate = true});
  const Stream stream = device.default_stream();
  AutoencoderKLDecoder dec(AutoencoderKLConfig::flux());
  models::make_meta_parameters(dec.parameters(), DType::bf16);
  const Tensor image = dec.decode(Tensor::meta({1, 16, 128, 128}, DType::f32), stream);
  EXPECT_EQ(image.shape(), (Shape{1, 3, 1024, 1024}));
  EXPECT_FALSE(image.has_storage());
  // 2048 x 2048 in 128-latent tiles every 96: 3 x 3 tiles.
  const uint64_t before = device.stats().kernels;
  const Tensor tiled = dec.decode_tiled(Tensor::meta({1, 16, 256, 256}, DType::f32), {}, stream);
  EXPECT_EQ(tiled.shape(), (Shape{1, 3, 2048, 2048}));
  device.synchronize();
  EXPECT_GT(device.stats().kernels, before);
}

}  // namespace autoencoder_kl_test
}  // namespace cubevec
