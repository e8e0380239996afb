// AutoencoderKLWan (the Wan2.1 VAE decoder): config parsing and its errors, diffusers weight names,
// the causal conv and its feature cache against a direct loop, the upsample3d first-frame rule, the
// whole decoder against a plain double-precision whole-sequence decode written here from
// docs/models.md "AutoencoderKLWan decoder", chunked (frame-by-frame) == whole-sequence decode,
// frame counts, the loader, memory bounded by one chunk, simulate mode at full size, and parity
// with the PyTorch goldens.
#include "models/autoencoder_kl_wan.h"

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
#include "base/strict_json.h"

namespace cubevec {
namespace autoencoder_kl_wan_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using models::AutoencoderKLWan;
using models::AutoencoderKLWanConfig;
using models::WanDecodeOptions;
namespace wan_vae = models::wan_vae;

// --- plain-loop reference (whole-sequence semantics of docs/models.md "AutoencoderKLWan decoder") ---

// An NCTHW video in double.
struct Vid {
  int64_t b = 0, c = 0, t = 0, h = 0, w = 0;
  std::vector<double> v;
  Vid() = default;
  Vid(int64_t b_, int64_t c_, int64_t t_, int64_t h_, int64_t w_)
      : b(b_), c(c_), t(t_), h(h_), w(w_), v(static_cast<std::size_t>(b_ * c_ * t_ * h_ * w_)) {}
  std::size_t index(int64_t n, int64_t ch, int64_t f, int64_t y, int64_t x) const {
    return static_cast<std::size_t>((((n * c + ch) * t + f) * h + y) * w + x);
  }
  double& at(int64_t n, int64_t ch, int64_t f, int64_t y, int64_t x) { return v[index(n, ch, f, y, x)]; }
  double at(int64_t n, int64_t ch, int64_t f, int64_t y, int64_t x) const { return v[index(n, ch, f, y, x)]; }
};

Vid vid_of(const Tensor& t) {
  Vid out(t.size(0), t.size(1), t.size(2), t.size(3), t.size(4));
  out.v = values(t);
  return out;
}

// Frames [first, first + count) of x.
Vid frames_of(const Vid& x, int64_t first, int64_t count) {
  Vid out(x.b, x.c, count, x.h, x.w);
  for (int64_t n = 0; n < x.b; ++n)
    for (int64_t ch = 0; ch < x.c; ++ch)
      for (int64_t f = 0; f < count; ++f)
        for (int64_t y = 0; y < x.h; ++y)
          for (int64_t xx = 0; xx < x.w; ++xx) out.at(n, ch, f, y, xx) = x.at(n, ch, first + f, y, xx);
  return out;
}

// The causal conv over the whole sequence, directly: output frame f reads input frames
// f - 2 p_t + k (zero before frame 0), rows y - p_h + k, columns x - p_w + k (zero outside).
Vid ref_causal_conv(const Vid& x, const wan_vae::CausalConv3d& conv) {
  const std::vector<double> wt = values(conv.weight), bias = values(conv.bias);
  const auto [kt, kh, kw] = conv.kernel;
  const auto [pt, ph, pw] = conv.padding;
  EXPECT_EQ(conv.in, x.c);
  Vid y(x.b, conv.out, x.t, x.h + 2 * ph - kh + 1, x.w + 2 * pw - kw + 1);
  for (int64_t n = 0; n < x.b; ++n)
    for (int64_t o = 0; o < conv.out; ++o)
      for (int64_t f = 0; f < y.t; ++f)
        for (int64_t yy = 0; yy < y.h; ++yy)
          for (int64_t xx = 0; xx < y.w; ++xx) {
            double s = bias[static_cast<std::size_t>(o)];
            for (int64_t ic = 0; ic < x.c; ++ic)
              for (int64_t a = 0; a < kt; ++a) {
                const int64_t fi = f - 2 * pt + a;
                if (fi < 0) continue;
                for (int64_t bb = 0; bb < kh; ++bb)
                  for (int64_t cc = 0; cc < kw; ++cc) {
                    const int64_t yi = yy - ph + bb, xi = xx - pw + cc;
                    if (yi < 0 || xi < 0 || yi >= x.h || xi >= x.w) continue;
                    s += x.at(n, ic, fi, yi, xi) * wt[static_cast<std::size_t>((((o * x.c + ic) * kt + a) * kh + bb) * kw + cc)];
                  }
              }
            y.at(n, o, f, yy, xx) = s;
          }
  return y;
}

// x / max(||x||_2 over channels, 1e-12) * sqrt(C) * gamma, then SiLU when asked.
Vid ref_rms(const Vid& x, const wan_vae::RMSNorm& norm, bool silu) {
  const std::vector<double> g = values(norm.gamma);
  Vid y = x;
  for (int64_t n = 0; n < x.b; ++n)
    for (int64_t f = 0; f < x.t; ++f)
      for (int64_t yy = 0; yy < x.h; ++yy)
        for (int64_t xx = 0; xx < x.w; ++xx) {
          double sq = 0;
          for (int64_t ch = 0; ch < x.c; ++ch) sq += x.at(n, ch, f, yy, xx) * x.at(n, ch, f, yy, xx);
          const double inv = std::sqrt(static_cast<double>(x.c)) / std::max(std::sqrt(sq), 1e-12);
          for (int64_t ch = 0; ch < x.c; ++ch) {
            double& v = y.at(n, ch, f, yy, xx);
            v = v * inv * g[static_cast<std::size_t>(ch)];
            if (silu) v = v / (1.0 + std::exp(-v));
          }
        }
  return y;
}

Vid ref_add(Vid a, const Vid& b) {
  for (std::size_t i = 0; i < a.v.size(); ++i) a.v[i] += b.v[i];
  return a;
}

Vid ref_resnet(const Vid& x, const wan_vae::ResidualBlock& r) {
  const Vid h = ref_causal_conv(ref_rms(ref_causal_conv(ref_rms(x, r.norm1, true), r.conv1), r.norm2, true), r.conv2);
  return ref_add(r.has_shortcut ? ref_causal_conv(x, r.conv_shortcut) : x, h);
}

// Per frame: q, k, v from the 1x1 to_qkv of the normed frame, softmax(q k^T / sqrt(C)) v, proj, + x.
Vid ref_attention(const Vid& x, const wan_vae::AttentionBlock& a) {
  const Vid g = ref_rms(x, a.norm, false);
  const std::vector<double> wqkv = values(a.qkv_weight), bqkv = values(a.qkv_bias), wp = values(a.proj_weight), bp = values(a.proj_bias);
  const int64_t c = x.c, hw = x.h * x.w;
  Vid out = x;
  for (int64_t n = 0; n < x.b; ++n)
    for (int64_t f = 0; f < x.t; ++f) {
      // qkv[s][j], j in [0, 3C)
      std::vector<double> qkv(static_cast<std::size_t>(hw * 3 * c));
      for (int64_t s = 0; s < hw; ++s)
        for (int64_t j = 0; j < 3 * c; ++j) {
          double acc = bqkv[static_cast<std::size_t>(j)];
          for (int64_t k = 0; k < c; ++k) acc += wqkv[static_cast<std::size_t>(j * c + k)] * g.at(n, k, f, s / x.w, s % x.w);
          qkv[static_cast<std::size_t>(s * 3 * c + j)] = acc;
        }
      std::vector<double> att(static_cast<std::size_t>(hw * c));
      for (int64_t i = 0; i < hw; ++i) {
        std::vector<double> p(static_cast<std::size_t>(hw));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < hw; ++j) {
          double s = 0;
          for (int64_t d = 0; d < c; ++d)
            s += qkv[static_cast<std::size_t>(i * 3 * c + d)] * qkv[static_cast<std::size_t>(j * 3 * c + c + d)];
          p[static_cast<std::size_t>(j)] = s / std::sqrt(static_cast<double>(c));
          mx = std::max(mx, p[static_cast<std::size_t>(j)]);
        }
        for (double& e : p) sum += (e = std::exp(e - mx));
        for (int64_t d = 0; d < c; ++d) {
          double s = 0;
          for (int64_t j = 0; j < hw; ++j) s += p[static_cast<std::size_t>(j)] * qkv[static_cast<std::size_t>(j * 3 * c + 2 * c + d)];
          att[static_cast<std::size_t>(i * c + d)] = s / sum;
        }
      }
      for (int64_t s = 0; s < hw; ++s)
        for (int64_t o = 0; o < c; ++o) {
          double acc = bp[static_cast<std::size_t>(o)];
          for (int64_t k = 0; k < c; ++k) acc += wp[static_cast<std::size_t>(o * c + k)] * att[static_cast<std::size_t>(s * c + k)];
          out.at(n, o, f, s / x.w, s % x.w) += acc;
        }
    }
  return out;
}

// Per frame: nearest 2x, then the 3x3 pad-1 Conv2d.
Vid ref_upsample_conv(const Vid& x, const models::Conv2d& conv) {
  const std::vector<double> wt = values(conv.weight), bias = values(conv.bias);
  Vid y(x.b, conv.out, x.t, 2 * x.h, 2 * x.w);
  for (int64_t n = 0; n < x.b; ++n)
    for (int64_t o = 0; o < conv.out; ++o)
      for (int64_t f = 0; f < x.t; ++f)
        for (int64_t yy = 0; yy < y.h; ++yy)
          for (int64_t xx = 0; xx < y.w; ++xx) {
            double s = bias[static_cast<std::size_t>(o)];
            for (int64_t ic = 0; ic < x.c; ++ic)
              for (int64_t a = 0; a < 3; ++a)
                for (int64_t bb = 0; bb < 3; ++bb) {
                  const int64_t yi = yy - 1 + a, xi = xx - 1 + bb;
                  if (yi < 0 || xi < 0 || yi >= y.h || xi >= y.w) continue;
                  s += x.at(n, ic, f, yi / 2, xi / 2) * wt[static_cast<std::size_t>(((o * x.c + ic) * 3 + a) * 3 + bb)];
                }
            y.at(n, o, f, yy, xx) = s;
          }
  return y;
}

// upsample3d: frame 0 alone; frames 1.. through the causal time_conv (2 zero frames in front,
// frame 0 never context), each giving two frames (channels [0, C) then [C, 2C)); then per frame 2x.
Vid ref_resample(const Vid& x, const wan_vae::Resample& r) {
  if (r.mode == wan_vae::Resample::Mode::upsample2d) return ref_upsample_conv(x, r.resample);
  Vid seq(x.b, x.c, 1 + 2 * (x.t - 1), x.h, x.w);
  const Vid doubled = x.t > 1 ? ref_causal_conv(frames_of(x, 1, x.t - 1), r.time_conv) : Vid();
  for (int64_t n = 0; n < x.b; ++n)
    for (int64_t ch = 0; ch < x.c; ++ch)
      for (int64_t yy = 0; yy < x.h; ++yy)
        for (int64_t xx = 0; xx < x.w; ++xx) {
          seq.at(n, ch, 0, yy, xx) = x.at(n, ch, 0, yy, xx);
          for (int64_t i = 0; i + 1 < x.t; ++i) {
            seq.at(n, ch, 1 + 2 * i, yy, xx) = doubled.at(n, ch, i, yy, xx);
            seq.at(n, ch, 2 + 2 * i, yy, xx) = doubled.at(n, x.c + ch, i, yy, xx);
          }
        }
  return ref_upsample_conv(seq, r.resample);
}

Vid ref_up_block(Vid x, const wan_vae::UpBlock& block) {
  for (const auto& r : block.resnets) x = ref_resnet(x, r);
  return block.has_upsampler ? ref_resample(x, block.upsampler) : x;
}

Vid ref_decode(const Vid& z, const AutoencoderKLWan& vae) {
  const auto& m = vae.modules();
  Vid x = ref_causal_conv(ref_causal_conv(z, m.post_quant_conv), m.conv_in);
  x = ref_resnet(ref_attention(ref_resnet(x, m.mid_block.resnet0), m.mid_block.attention), m.mid_block.resnet1);
  for (const auto& block : m.up_blocks) x = ref_up_block(x, block);
  return ref_causal_conv(ref_rms(x, m.norm_out, true), m.conv_out);
}

// max |got - want| <= rel * max |want|, reporting the worst element; returns that max error.
double expect_close_scaled(const Tensor& got, const std::vector<double>& want, double rel, const std::string& what) {
  const std::vector<double> g = values(got);
  EXPECT_EQ(g.size(), want.size()) << what;
  if (g.size() != want.size()) return INFINITY;
  double scale = 0, worst = 0;
  std::size_t at = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - want[i]) <= worst)) {
      worst = std::isnan(g[i]) ? INFINITY : std::fabs(g[i] - want[i]);
      at = i;
    }
  EXPECT_GT(scale, 0.0) << what;
  EXPECT_LE(worst, rel * scale) << what << ": worst at " << at << " got " << g[at] << " expected " << want[at] << " (max |expected| "
                                << scale << ")";
  return worst;
}

// --- fixtures ---------------------------------------------------------------------------------------

// The goldens' tiny config: base_dim 4, z_dim 4, dim_mult [1, 2, 4, 4], 2 res blocks, time
// upsampling in up blocks 0 and 1: widths [16, 16, 16, 8, 4], 8x space, 4x time.
AutoencoderKLWanConfig tiny_config() {
  AutoencoderKLWanConfig c;
  c.base_dim = 4;
  c.z_dim = 4;
  c.latents_mean = {-0.7571, -0.7089, -0.9113, 0.1075};
  c.latents_std = {2.8184, 1.4541, 2.3275, 2.6558};
  return c;
}

// Odd widths and one temporal upsampler: base 3, dim_mult [2, 3] -> widths [9, 9, 6]; up block 0
// 9 -> 9 then upsample3d (9 -> 4 channels), up block 1 4 -> 6; no extra res blocks; 2 outputs.
AutoencoderKLWanConfig odd_config() {
  AutoencoderKLWanConfig c;
  c.base_dim = 3;
  c.z_dim = 2;
  c.dim_mult = {2, 3};
  c.num_res_blocks = 0;
  c.temperal_downsample = {true};
  c.out_channels = 2;
  c.latents_mean = {0.5, -0.25};
  c.latents_std = {2.0, 0.5};
  c.scale_factor_temporal = 2;
  c.scale_factor_spatial = 2;
  return c;
}

AutoencoderKLWan random_vae(const AutoencoderKLWanConfig& config, uint64_t seed = 5, float scale = 0.25f) {
  AutoencoderKLWan vae(config);
  models::make_random_parameters(vae.parameters(), DType::f32, seed, scale);
  return vae;
}

std::string data_dir() { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/"; }

// Wan2.1's vae/config.json as diffusers writes it.
const char* kWan21Config = R"({
  "_class_name": "AutoencoderKLWan",
  "_diffusers_version": "0.33.0.dev0",
  "attn_scales": [],
  "base_dim": 96,
  "dim_mult": [1, 2, 4, 4],
  "dropout": 0.0,
  "latents_mean": [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517,
                   -0.3632, -0.1922, -0.9497, 0.2503, -0.2921],
  "latents_std": [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
                  1.6382, 1.1253, 2.8251, 1.916],
  "num_res_blocks": 2,
  "temperal_downsample": [false, true, true],
  "z_dim": 16
})";

// Test files in a fresh temp directory.
struct TempDir : cubevec::testing::TempDir {
  TempDir() : cubevec::testing::TempDir("cubevec_wan_vae_test") {}
};

// --- config -----------------------------------------------------------------------------------------

TEST(AutoencoderKLWanConfig, ParsesWan21AndTheTinyConfig) {
  const auto c = AutoencoderKLWanConfig::from_json(nlohmann::json::parse(kWan21Config), "wan/vae");
  const auto d = AutoencoderKLWanConfig::wan21();
  EXPECT_EQ(c.base_dim, 96);
  EXPECT_EQ(c.decoder_dim(), 96);
  EXPECT_EQ(c.z_dim, 16);
  EXPECT_EQ(c.dim_mult, (std::vector<int64_t>{1, 2, 4, 4}));
  EXPECT_EQ(c.num_res_blocks, 2);
  EXPECT_EQ(c.temperal_downsample, (std::vector<bool>{false, true, true}));
  EXPECT_EQ(c.temperal_upsample(), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(c.latents_mean, d.latents_mean);
  EXPECT_EQ(c.latents_std, d.latents_std);
  EXPECT_DOUBLE_EQ(c.latents_mean[7], 1.5508);
  EXPECT_DOUBLE_EQ(c.latents_std[15], 1.916);
  EXPECT_EQ(c.spatial_upscale(), 8);
  EXPECT_EQ(c.temporal_upscale(), 4);
  EXPECT_EQ(c.scale_factor_spatial, 8);
  EXPECT_EQ(c.scale_factor_temporal, 4);
  EXPECT_EQ(c.num_frames(21), 81);
  EXPECT_EQ(c.num_frames(1), 1);
  EXPECT_EQ(d.base_dim, c.base_dim);
  EXPECT_EQ(d.z_dim, c.z_dim);
  EXPECT_EQ(d.dim_mult, c.dim_mult);
  EXPECT_EQ(d.temperal_downsample, c.temperal_downsample);
  // The goldens' tiny config (every key diffusers writes, decoder_base_dim null).
  const auto tiny = AutoencoderKLWanConfig::load(data_dir() + "wan_tiny/vae/config.json");
  EXPECT_EQ(tiny.base_dim, 4);
  EXPECT_EQ(tiny.decoder_base_dim, 0);
  EXPECT_EQ(tiny.z_dim, 4);
  EXPECT_EQ(tiny.latents_std.size(), 4u);
  EXPECT_EQ(tiny.num_frames(3), 9);
  // decoder_base_dim, patch_size 1, clip_output and scale factors given explicitly.
  auto j = nlohmann::json::parse(kWan21Config);
  j["decoder_base_dim"] = 48;
  j["patch_size"] = 1;
  j["clip_output"] = true;
  j["is_residual"] = false;
  j["scale_factor_temporal"] = 4;
  j["scale_factor_spatial"] = nullptr;
  j["in_channels"] = 3;
  j["out_channels"] = 3;
  j["attn_scales"] = {0.25};  // the encoder's; the decoder ignores it, as diffusers' does
  const auto e = AutoencoderKLWanConfig::from_json(j, "explicit");
  EXPECT_EQ(e.decoder_dim(), 48);
  EXPECT_EQ(e.scale_factor_spatial, 8);
}

TEST(AutoencoderKLWanConfig, BadConfigsNameTheFileAndTheKey) {
  TempDir dir;
  const auto base = nlohmann::json::parse(kWan21Config);
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](auto& j) { j["decoder_attention"] = true; }, ": unknown key 'decoder_attention' for AutoencoderKLWan"},
      {[](auto& j) { j["_class_name"] = "AutoencoderKL"; }, ": this is a \"AutoencoderKL\" config; expected \"AutoencoderKLWan\""},
      {[](auto& j) { j["base_dim"] = 96.0; }, ": 'base_dim' must be an integer in [1, 16777216], got 96.0"},
      {[](auto& j) { j["z_dim"] = "16"; }, ": 'z_dim' must be an integer in [1, 16777216], got \"16\""},
      {[](auto& j) { j["dim_mult"] = nlohmann::json::array(); }, ": 'dim_mult' must be a non-empty list of integers in [1, 16777216]"},
      {[](auto& j) {
         j["dim_mult"] = {1, 0, 4, 4};
       },
       ": 'dim_mult' entry 1 must be an integer in [1, 16777216], got 0"},
      {[](auto& j) { j["num_res_blocks"] = -1; }, ": 'num_res_blocks' must be an integer in [0, 16777216], got -1"},
      {[](auto& j) {
         j["temperal_downsample"] = {false, 1, true};
       },
       ": 'temperal_downsample' must be a list of true / false"},
      {[](auto& j) {
         j["temperal_downsample"] = {false, true};
       },
       ": 'temperal_downsample' must have len(dim_mult) - 1 = 3 entries, got 2"},
      {[](auto& j) { j["attn_scales"] = {"x"}; }, ": 'attn_scales' must be a list of finite numbers"},
      {[](auto& j) { j["dropout"] = "0"; }, ": 'dropout' must be a number in [0, 1], got \"0\""},
      {[](auto& j) { j["dropout"] = 1.5; }, ": 'dropout' must be a number in [0, 1], got 1.5"},
      {[](auto& j) { j["latents_mean"] = nullptr; }, ": 'latents_mean' must be a list of finite numbers, got null"},
      {[](auto& j) { j["latents_std"].erase(0); }, ": 'latents_std' must list z_dim = 16 numbers, got 15"},
      {[](auto& j) { j["latents_std"][3] = 0.0; },
       ": every 'latents_std' entry must be a finite number of magnitude in [1e-6, 1e6], got 0"},
      {[](auto& j) { j["latents_std"][3] = 1e-320; },
       ": every 'latents_std' entry must be a finite number of magnitude in [1e-6, 1e6], got 1e-320"},
      {[](auto& j) { j["latents_mean"][0] = 1e308; }, ": every 'latents_mean' entry must be a finite number in [-1e6, 1e6], got 1e+308"},
      {[](auto& j) { j["is_residual"] = "no"; }, ": 'is_residual' must be true or false, got \"no\""},
      {[](auto& j) { j["patch_size"] = 2; }, ": 'in_channels' 3 must be a multiple of 'patch_size' squared (4)"},
      {[](auto& j) { j["scale_factor_temporal"] = 8; }, ": 'scale_factor_temporal' 8 does not match the decoder, which upsamples time 4x"},
      {[](auto& j) { j["scale_factor_spatial"] = 16; }, ": 'scale_factor_spatial' 16 does not match the decoder, which upsamples space 8x"},
      {[](auto& j) { j["clip_output"] = 1; }, ": 'clip_output' must be true or false, got 1"},
      {[](auto& j) { j["decoder_base_dim"] = 0; }, ": 'decoder_base_dim' must be an integer in [1, 16777216], got 0"},
      {[](auto& j) {
         j["dim_mult"] = {1, 2, 4, 100000};
       },
       ": decoder width 96 x dim_mult 100000 exceeds 65536 channels"},
  };
  for (const auto& [edit, expected] : cases) {
    nlohmann::json j = base;
    edit(j);
    const std::string path = dir.write("config.json", j.dump(2));
    const std::string msg = message_of([&] { AutoencoderKLWanConfig::load(path); });
    EXPECT_NE(msg.find(path + expected), std::string::npos) << "expected '" << expected << "', got: " << msg;
  }
  std::string msg = message_of([&] { AutoencoderKLWanConfig::load((dir.path / "absent.json").string()); });
  EXPECT_NE(msg.find("absent.json: cannot open: No such file"), std::string::npos) << msg;
  // A config made in code is checked too.
  AutoencoderKLWanConfig c = tiny_config();
  c.latents_mean.pop_back();
  msg = message_of([&] { AutoencoderKLWan vae(c); });
  EXPECT_NE(msg.find("AutoencoderKLWan: 'latents_mean' must list z_dim = 4 numbers, got 3"), std::string::npos) << msg;
}

// --- weights ----------------------------------------------------------------------------------------

TEST(AutoencoderKLWan, DeclaresDiffusersNamesAndShapes) {
  const AutoencoderKLWan vae(AutoencoderKLWanConfig::wan21());
  std::map<std::string, Shape> specs;
  for (const auto& s : vae.parameters().specs()) specs[s.name] = s.shape;
  // The decoder's weights (docs/models.md, "AutoencoderKLWan decoder"; diffusers' names).
  const std::map<std::string, Shape> expected = {
      {"post_quant_conv.weight", {16, 16, 1, 1, 1}},
      {"post_quant_conv.bias", {16}},
      {"decoder.conv_in.weight", {384, 16, 3, 3, 3}},
      {"decoder.conv_in.bias", {384}},
      {"decoder.mid_block.resnets.0.norm1.gamma", {384, 1, 1, 1}},
      {"decoder.mid_block.resnets.1.norm2.gamma", {384, 1, 1, 1}},
      {"decoder.mid_block.resnets.0.conv1.weight", {384, 384, 3, 3, 3}},
      {"decoder.mid_block.resnets.1.conv2.bias", {384}},
      {"decoder.mid_block.attentions.0.norm.gamma", {384, 1, 1}},
      {"decoder.mid_block.attentions.0.to_qkv.weight", {1152, 384, 1, 1}},
      {"decoder.mid_block.attentions.0.to_qkv.bias", {1152}},
      {"decoder.mid_block.attentions.0.proj.weight", {384, 384, 1, 1}},
      {"decoder.mid_block.attentions.0.proj.bias", {384}},
      {"decoder.up_blocks.0.resnets.2.conv2.weight", {384, 384, 3, 3, 3}},
      {"decoder.up_blocks.0.upsamplers.0.time_conv.weight", {768, 384, 3, 1, 1}},
      {"decoder.up_blocks.0.upsamplers.0.time_conv.bias", {768}},
      {"decoder.up_blocks.0.upsamplers.0.resample.1.weight", {192, 384, 3, 3}},
      {"decoder.up_blocks.0.upsamplers.0.resample.1.bias", {192}},
      {"decoder.up_blocks.1.resnets.0.norm1.gamma", {192, 1, 1, 1}},
      {"decoder.up_blocks.1.resnets.0.conv1.weight", {384, 192, 3, 3, 3}},
      {"decoder.up_blocks.1.resnets.0.conv_shortcut.weight", {384, 192, 1, 1, 1}},
      {"decoder.up_blocks.1.resnets.0.conv_shortcut.bias", {384}},
      {"decoder.up_blocks.1.upsamplers.0.time_conv.weight", {768, 384, 3, 1, 1}},
      {"decoder.up_blocks.1.upsamplers.0.resample.1.weight", {192, 384, 3, 3}},
      {"decoder.up_blocks.2.resnets.0.conv1.weight", {192, 192, 3, 3, 3}},
      {"decoder.up_blocks.2.upsamplers.0.resample.1.weight", {96, 192, 3, 3}},
      {"decoder.up_blocks.3.resnets.0.conv1.weight", {96, 96, 3, 3, 3}},
      {"decoder.up_blocks.3.resnets.2.norm2.gamma", {96, 1, 1, 1}},
      {"decoder.norm_out.gamma", {96, 1, 1, 1}},
      {"decoder.conv_out.weight", {3, 96, 3, 3, 3}},
      {"decoder.conv_out.bias", {3}},
  };
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(specs.count(name)) << name;
    EXPECT_EQ(specs[name], shape) << name;
  }
  for (const char* absent : {"decoder.up_blocks.2.upsamplers.0.time_conv.weight", "decoder.up_blocks.3.upsamplers.0.resample.1.weight",
                             "decoder.up_blocks.0.resnets.0.conv_shortcut.weight", "decoder.up_blocks.2.resnets.0.conv_shortcut.weight",
                             "decoder.up_blocks.3.resnets.0.conv_shortcut.weight", "decoder.up_blocks.0.resnets.3.norm1.gamma",
                             "decoder.mid_block.attentions.1.norm.gamma", "quant_conv.weight", "decoder.conv_norm_out.weight"})
    EXPECT_FALSE(specs.count(absent)) << absent;
  // Counted by kind; every conv has a bias.
  int gammas = 0, weights = 0, biases = 0;
  for (const auto& [name, shape] : specs) {
    gammas += name.ends_with(".gamma");
    weights += name.ends_with(".weight");
    biases += name.ends_with(".bias");
  }
  // Norms: 2 per residual block (2 mid + 12 up), the attention's and norm_out.
  EXPECT_EQ(gammas, 2 * 14 + 2);
  // Convs: post_quant, conv_in, 2 per residual block, 1 shortcut, qkv + proj, 3 resample.1,
  // 2 time_conv, conv_out.
  EXPECT_EQ(weights, 2 + 2 * 14 + 1 + 2 + 3 + 2 + 1);
  EXPECT_EQ(biases, weights);
  EXPECT_EQ(specs.size(), static_cast<std::size_t>(gammas + weights + biases));
  // The caches: conv_in, 2 per residual block, 2 time_convs, conv_out.
  EXPECT_EQ(vae.modules().cache_slots, 1 + 2 * 14 + 2 + 1);
  EXPECT_EQ(vae.modules().temporal_upsamplers, 2);
}

// --- primitives -------------------------------------------------------------------------------------

TEST(AutoencoderKLWan, CausalConvMatchesADirectLoopAndChainsItsCache) {
  struct Case {
    std::array<int64_t, 3> kernel, padding;
  };
  const Case cases[] = {{{3, 3, 3}, {1, 1, 1}}, {{3, 1, 1}, {1, 0, 0}}, {{1, 1, 1}, {0, 0, 0}}, {{3, 3, 3}, {1, 0, 1}}};
  for (const Case& k : cases) {
    models::ParameterTable table;
    wan_vae::CausalConv3d conv;
    int slots = 0;
    conv.declare(table, "conv", 3, 5, k.kernel, k.padding, slots);
    EXPECT_EQ(slots, k.padding[0] > 0 ? 1 : 0);
    models::make_random_parameters(table, DType::f32, 7, 0.5f);
    const std::string what = "kernel " + std::to_string(k.kernel[0]) + "x" + std::to_string(k.kernel[1]) + " padding " +
                             std::to_string(k.padding[0]) + "," + std::to_string(k.padding[1]) + "," + std::to_string(k.padding[2]);
    const Tensor x = random_tensor({2, 3, 6, 5, 4}, 31);
    const Vid want = ref_causal_conv(vid_of(x), conv);
    const Tensor whole = conv(x, Tensor(), ops::default_op_stream());
    ASSERT_EQ(whole.shape(), (Shape{2, 5, 6, want.h, want.w})) << what;
    expect_close_scaled(whole, want.v, 1e-6, what + " whole");
    // Chunks of 1, 2 and 3 frames through the feature cache give the same frames.
    for (const std::vector<int64_t>& split : {std::vector<int64_t>{1, 1, 1, 1, 1, 1}, {1, 2, 3}, {3, 1, 2}, {2, 4}}) {
      wan_vae::FeatureCache cache(slots, 0);
      std::vector<Tensor> parts;
      int64_t start = 0;
      for (int64_t n : split) {
        parts.push_back(conv(x.narrow(2, start, n), cache, ops::default_op_stream()));
        start += n;
        if (conv.slot >= 0) {  // the slot holds the last min(2, frames so far) input frames
          const Tensor& held = cache.frames[0];
          const int64_t kept = std::min<int64_t>(2, start);
          ASSERT_EQ(held.shape(), (Shape{2, 3, kept, 5, 4})) << what;
          expect_close(held, values(x.narrow(2, start - kept, kept)), DType::f32, what + " cache", Tolerance{0, 0});
        }
      }
      expect_close_scaled(ops::concat(parts, 2), want.v, 1e-6, what + " chunked");
    }
    // A cache given explicitly stands for the frames before x.
    if (conv.context() > 0) {
      const Tensor tail = conv(x.narrow(2, 4, 2), x.narrow(2, 2, 2), ops::default_op_stream());
      expect_close_scaled(tail, frames_of(want, 4, 2).v, 1e-6, what + " explicit cache");
      const std::string msg = message_of([&] { conv(x.narrow(2, 3, 3), x.narrow(2, 0, 3), ops::default_op_stream()); });
      EXPECT_NE(msg.find("WanCausalConv3d: the cache must be [B, C, t <= 2, H, W] matching the input [2, 3, 3, 5, 4], "
                         "got [2, 3, 3, 5, 4]"),
                std::string::npos)
          << msg;
    }
  }
}

TEST(AutoencoderKLWan, Upsample3dPassesTheFirstFrameAloneAndDoublesTheRest) {
  models::ParameterTable table;
  wan_vae::Resample up;
  int slots = 0, upsamplers = 0;
  up.declare(table, "up", 6, wan_vae::Resample::Mode::upsample3d, slots, upsamplers);
  EXPECT_EQ(slots, 1);
  EXPECT_EQ(upsamplers, 1);
  models::make_random_parameters(table, DType::f32, 9, 0.4f);
  const Tensor x = random_tensor({1, 6, 4, 3, 5}, 32);
  const Vid want = ref_resample(vid_of(x), up);
  ASSERT_EQ(want.t, 7);
  for (const std::vector<int64_t>& split : {std::vector<int64_t>{4}, {1, 1, 1, 1}, {1, 3}, {2, 2}}) {
    wan_vae::FeatureCache cache(slots, upsamplers);
    std::vector<Tensor> parts;
    int64_t start = 0;
    for (int64_t n : split) {
      parts.push_back(up(x.narrow(2, start, n), cache, ops::default_op_stream()));
      // 1 + 2 (n - 1) frames for the first chunk, 2 n after.
      EXPECT_EQ(parts.back().size(2), start == 0 ? 2 * n - 1 : 2 * n);
      start += n;
    }
    const Tensor got = ops::concat(parts, 2);
    ASSERT_EQ(got.shape(), (Shape{1, 3, 7, 6, 10}));
    expect_close_scaled(got, want.v, 1e-6, "split of " + std::to_string(split.size()));
  }
  // Frame 0 is exactly resample.1 of the upsampled input frame 0: no time_conv touched it.
  wan_vae::FeatureCache cache(slots, upsamplers);
  const Tensor first = up(x.narrow(2, 0, 1), cache, ops::default_op_stream());
  const Tensor direct = up.resample(ops::upsample_nearest2d(x.select(2, 0).contiguous(), 2), ops::default_op_stream());
  expect_close(first.select(2, 0), values(direct), DType::f32, "first frame", Tolerance{0, 0});
  EXPECT_FALSE(cache.frames[0].defined());  // the time_conv has seen nothing yet
  // upsample2d: per frame, no time change.
  models::ParameterTable table2;
  wan_vae::Resample up2;
  up2.declare(table2, "up2", 6, wan_vae::Resample::Mode::upsample2d, slots, upsamplers);
  models::make_random_parameters(table2, DType::f32, 10, 0.4f);
  wan_vae::FeatureCache cache2(slots, upsamplers);
  expect_close_scaled(up2(x, cache2, ops::default_op_stream()), ref_resample(vid_of(x), up2).v, 1e-6, "upsample2d");
}

TEST(AutoencoderKLWan, ResidualAndAttentionBlocksMatchPlainLoops) {
  const AutoencoderKLWan vae = random_vae(tiny_config(), 12, 0.3f);
  const auto& m = vae.modules();
  const Stream stream = ops::default_op_stream();
  const Tensor x = random_tensor({2, 16, 3, 4, 5}, 33);
  wan_vae::FeatureCache cache = vae.make_feature_cache();
  expect_close_scaled(m.mid_block.resnet0(x, cache, stream), ref_resnet(vid_of(x), m.mid_block.resnet0).v, 1e-5, "resnet 16 -> 16");
  expect_close_scaled(m.mid_block.attention(x, stream), ref_attention(vid_of(x), m.mid_block.attention).v, 1e-5, "attention");
  expect_close_scaled(m.mid_block.attention(strided_copy_of(x), stream), ref_attention(vid_of(x), m.mid_block.attention).v, 1e-5,
                      "attention, strided input");
  const Tensor y = random_tensor({1, 8, 2, 6, 6}, 34);  // up_blocks.1.resnets.0: 8 -> 16 with a shortcut
  const auto& r = m.up_blocks[1].resnets[0];
  ASSERT_TRUE(r.has_shortcut);
  expect_close_scaled(r(y, cache, stream), ref_resnet(vid_of(y), r).v, 1e-5, "resnet 8 -> 16");
}

// --- the whole decoder ------------------------------------------------------------------------------

TEST(AutoencoderKLWan, DecodeMatchesPlainLoopsForEveryChunking) {
  for (const auto& [config, name] : {std::pair{tiny_config(), "tiny"}, std::pair{odd_config(), "odd"}}) {
    const AutoencoderKLWan vae = random_vae(config, 13, 0.3f);
    const int64_t up = config.spatial_upscale();
    const Tensor z = random_tensor({2, config.z_dim, 3, 3, 2}, 35, DType::f32, 2.0f);
    const Vid want = ref_decode(vid_of(z), vae);
    ASSERT_EQ(want.t, config.num_frames(3));
    for (int64_t chunk : {1, 2, 0}) {
      const std::string what = std::string(name) + " chunk " + std::to_string(chunk);
      const Tensor video = vae.decode(z, {.latent_frames_per_chunk = chunk, .clamp = false});
      ASSERT_EQ(video.shape(), (Shape{2, config.out_channels, config.num_frames(3), 3 * up, 2 * up})) << what;
      ASSERT_EQ(video.dtype(), DType::f32);
      expect_close_scaled(video, want.v, 1e-5, what);
    }
    // The clamped video is the clamp of the unclamped one.
    std::vector<double> clamped = want.v;
    for (double& v : clamped) v = std::clamp(v, -1.0, 1.0);
    const Tensor video = vae.decode(z);
    const std::vector<double> got = values(video);
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_LE(std::fabs(got[i]), 1.0) << name;
    expect_close(video, clamped, DType::f32, std::string(name) + " clamped", Tolerance{0, 2e-5});
  }
}

TEST(AutoencoderKLWan, DecodeFramesHandsOverOneChunkAtATime) {
  const AutoencoderKLWan vae = random_vae(tiny_config());
  const Tensor z = random_tensor({1, 4, 4, 2, 3}, 36);
  std::vector<Shape> shapes;
  std::vector<Tensor> chunks;
  vae.decode_frames(z, [&](const Tensor& frames) {
    shapes.push_back(frames.shape());
    chunks.push_back(frames);
  });
  // 1 frame for the first latent frame, then 4 per latent frame: 1 + 4 (T - 1) = 13.
  EXPECT_EQ(shapes, (std::vector<Shape>{{1, 3, 1, 16, 24}, {1, 3, 4, 16, 24}, {1, 3, 4, 16, 24}, {1, 3, 4, 16, 24}}));
  expect_close(ops::concat(chunks, 2), values(vae.decode(z)), DType::f32, "decode = concatenated chunks", Tolerance{0, 0});
  // Two latent frames per chunk: 1 + 4, then 8.
  shapes.clear();
  vae.decode_frames(z, [&](const Tensor& frames) { shapes.push_back(frames.shape()); }, {.latent_frames_per_chunk = 2});
  EXPECT_EQ(shapes, (std::vector<Shape>{{1, 3, 5, 16, 24}, {1, 3, 8, 16, 24}}));
  // One latent frame is one image.
  EXPECT_EQ(vae.decode(z.narrow(2, 0, 1)).shape(), (Shape{1, 3, 1, 16, 24}));
  // bf16 latents are widened; bf16 weights stay close to f32.
  const Tensor zb = ops::cast(z, DType::bf16);
  expect_close(vae.decode(zb), values(vae.decode(ops::cast(zb, DType::f32))), DType::f32, "bf16 z", Tolerance{0, 0});
  AutoencoderKLWan half(tiny_config());
  models::make_random_parameters(half.parameters(), DType::bf16, 5, 0.25f);
  EXPECT_EQ(half.modules().norm_out.gamma.dtype(), DType::f32);  // norms stay f32
  EXPECT_EQ(half.modules().conv_in.weight.dtype(), DType::bf16);
  expect_close_scaled(half.decode(z, {.clamp = false}), values(vae.decode(z, {.clamp = false})), 0.05, "bf16 weights");
}

TEST(AutoencoderKLWan, DecodeRejectsWrongInputs) {
  const AutoencoderKLWan vae = random_vae(tiny_config());
  std::string msg = message_of([&] { vae.decode(random_tensor({1, 3, 2, 2, 2}, 1)); });
  EXPECT_NE(msg.find("AutoencoderKLWan decode: z must be an f32 or bf16 latent [B, 4, T, h, w] with T, h, w >= 1, got "
                     "Tensor(f32, shape [1, 3, 2, 2, 2]"),
            std::string::npos)
      << msg;
  msg = message_of([&] { vae.decode(random_tensor({1, 4, 2, 2}, 1)); });
  EXPECT_NE(msg.find("z must be an f32 or bf16 latent"), std::string::npos) << msg;
  msg = message_of([&] { vae.decode(random_tensor({1, 4, 2, 2, 2}, 1), {.latent_frames_per_chunk = -1}); });
  EXPECT_NE(msg.find("latent_frames_per_chunk must be >= 1 (or 0 for the whole sequence), got -1"), std::string::npos) << msg;
  msg = message_of([&] { vae.unnormalize(random_tensor({1, 5, 2, 2, 2}, 1)); });
  EXPECT_NE(msg.find("AutoencoderKLWan unnormalize: latents must be f32 or bf16 [B, 4, T, h, w]"), std::string::npos) << msg;
  const AutoencoderKLWan other = random_vae(odd_config());
  wan_vae::FeatureCache foreign = other.make_feature_cache();
  msg = message_of([&] { vae.decode_chunk(random_tensor({1, 4, 1, 2, 2}, 1), foreign); });
  EXPECT_NE(msg.find("the feature cache was not made by this decoder's make_feature_cache()"), std::string::npos) << msg;
}

TEST(AutoencoderKLWan, UnnormalizeIsWanPipelinesF32Arithmetic) {
  const AutoencoderKLWan vae = random_vae(tiny_config());
  const Tensor latents = random_tensor({2, 4, 2, 3, 3}, 37);
  const std::vector<double> lv = values(latents);
  const Tensor z = vae.unnormalize(latents);
  ASSERT_EQ(z.shape(), latents.shape());
  const std::vector<double> zv = values(z);
  const auto& c = vae.config();
  for (std::size_t i = 0; i < lv.size(); ++i) {
    const auto ch = static_cast<std::size_t>(static_cast<int64_t>(i) / 18 % 4);
    const float inv = 1.0f / static_cast<float>(c.latents_std[ch]);
    const float want = static_cast<float>(lv[i]) / inv + static_cast<float>(c.latents_mean[ch]);
    ASSERT_EQ(static_cast<float>(zv[i]), want) << i;
  }
}

// --- loading ----------------------------------------------------------------------------------------

void write_vae_dir(const TempDir& dir, const AutoencoderKLWan& vae, const std::string& config_text,
                   const std::function<void(NamedTensors&)>& edit = {}) {
  NamedTensors tensors;
  for (const auto& s : vae.parameters().specs()) tensors.emplace_back(s.name, *s.slot);
  tensors.emplace_back("encoder.conv1.weight", random_tensor({4, 3, 3, 3, 3}, 1));
  tensors.emplace_back("encoder.head.0.gamma", random_tensor({4, 1, 1, 1}, 2));
  tensors.emplace_back("quant_conv.weight", random_tensor({8, 8, 1, 1, 1}, 3));
  tensors.emplace_back("quant_conv.bias", random_tensor({8}, 4));
  if (edit) edit(tensors);
  dir.write("config.json", config_text);
  write_safetensors((dir.path / "diffusion_pytorch_model.safetensors").string(), tensors);
}

std::string tiny_config_text() { return read_json_file(data_dir() + "wan_tiny/vae/config.json").dump(2); }

TEST(LoadAutoencoderKLWan, LoadsTheDecoderAndIgnoresTheEncoder) {
  TempDir dir;
  const AutoencoderKLWan ref = random_vae(tiny_config());
  write_vae_dir(dir, ref, tiny_config_text());
  const AutoencoderKLWan vae = models::load_autoencoder_kl_wan(dir.path.string());
  const Tensor z = random_tensor({1, 4, 2, 2, 2}, 5);
  expect_close(vae.decode(z), values(ref.decode(z)), DType::f32, "loaded", Tolerance{0, 0});
  const AutoencoderKLWan half = models::load_autoencoder_kl_wan(dir.path.string(), DType::bf16);
  EXPECT_EQ(half.modules().conv_in.weight.dtype(), DType::bf16);
  EXPECT_EQ(half.modules().mid_block.attention.norm.gamma.dtype(), DType::f32);
  expect_close_scaled(half.decode(z, {.clamp = false}), values(ref.decode(z, {.clamp = false})), 0.05, "bf16");
}

TEST(LoadAutoencoderKLWan, MismatchesListDecoderNamesOnly) {
  TempDir dir;
  const AutoencoderKLWan ref = random_vae(tiny_config());
  write_vae_dir(dir, ref, tiny_config_text(), [](NamedTensors& t) {
    std::erase_if(t, [](const auto& p) {
      return p.first == "decoder.conv_out.bias" || p.first == "decoder.up_blocks.1.upsamplers.0.time_conv.weight";
    });
    for (auto& [name, tensor] : t)
      if (name == "decoder.mid_block.attentions.0.to_qkv.weight") tensor = random_tensor({48, 16}, 6);
    t.emplace_back("decoder.up_blocks.3.upsamplers.0.resample.1.weight", random_tensor({2, 4, 3, 3}, 7));
  });
  const std::string msg = message_of([&] { models::load_autoencoder_kl_wan(dir.path.string()); });
  for (const char* part : {"does not match the model", "2 missing:", "decoder.conv_out.bias [3]",
                           "decoder.up_blocks.1.upsamplers.0.time_conv.weight [32, 16, 3, 1, 1]",
                           "1 mis-shaped:", "decoder.mid_block.attentions.0.to_qkv.weight: expected [48, 16, 1, 1], found [48, 16]",
                           "1 unexpected:", "decoder.up_blocks.3.upsamplers.0.resample.1.weight"})
    EXPECT_NE(msg.find(part), std::string::npos) << part << "\n" << msg;
  for (const char* ignored : {"encoder.conv1", "quant_conv.bias", "encoder.head"})
    EXPECT_EQ(msg.find(ignored), std::string::npos) << ignored << "\n" << msg;
  // A bad config.json is named.
  TempDir bad;
  write_vae_dir(bad, ref, R"({"_class_name": "AutoencoderKLWan", "base_dim": 4, "z_dim": 4, "is_residual": "yes"})");
  const std::string msg2 = message_of([&] { models::load_autoencoder_kl_wan(bad.path.string()); });
  EXPECT_NE(msg2.find("config.json: 'is_residual' must be true or false"), std::string::npos) << msg2;
}

// --- memory -----------------------------------------------------------------------------------------

// Allocator high-water mark of decode_frames (the chunks handed to a sink that drops them), above
// what was live before.
std::size_t decode_peak(const AutoencoderKLWan& vae, const Tensor& z) {
  CachingAllocator& alloc = default_allocator();
  default_device().synchronize();
  const std::size_t before = alloc.stats().live_bytes;
  alloc.reset_peak_stats();
  vae.decode_frames(z, [](const Tensor&) {});
  default_device().synchronize();
  return alloc.stats().peak_live_bytes - before;
}

TEST(AutoencoderKLWan, MemoryIsBoundedByOneChunk) {
  // Wan2.1's structure at a third of its width (base_dim 32), 96 x 64 video frames.
  AutoencoderKLWanConfig c = AutoencoderKLWanConfig::wan21();
  c.base_dim = 32;
  const AutoencoderKLWan vae = random_vae(c, 14, 0.05f);
  const int64_t h = 8, w = 12;
  const std::size_t peak3 = decode_peak(vae, random_tensor({1, 16, 3, h, w}, 38));
  const std::size_t peak6 = decode_peak(vae, random_tensor({1, 16, 6, h, w}, 39));
  const auto cache = static_cast<std::size_t>(vae.feature_cache_bytes(1, h, w));
  const auto estimate = static_cast<std::size_t>(vae.estimate_peak_bytes(1, h, w));
  std::printf(
      "[ memory ] base_dim 32, latent 3 x %lld x %lld: peak %.1f MB (6 latent frames: %.1f MB), "
      "caches %.1f MB, estimate %.1f MB\n",
      static_cast<long long>(h), static_cast<long long>(w), static_cast<double>(peak3) / 1e6, static_cast<double>(peak6) / 1e6,
      static_cast<double>(cache) / 1e6, static_cast<double>(estimate) / 1e6);
  EXPECT_GT(peak3, cache);
  EXPECT_LE(peak3, estimate);
  EXPECT_LE(peak6, estimate);
  // Twice the frames, the same peak (within allocator noise): nothing grows with the frame count.
  EXPECT_LE(static_cast<double>(peak6), 1.05 * static_cast<double>(peak3));
  // feature_cache_bytes is what a decode leaves in the caches after three or more latent frames
  // (the first temporal upsampler's time_conv sees its first frame in the second chunk).
  wan_vae::FeatureCache state = vae.make_feature_cache();
  const Tensor z = random_tensor({1, 16, 3, h, w}, 40);
  for (int64_t f = 0; f < 3; ++f) vae.decode_chunk(z.narrow(2, f, 1), state);
  EXPECT_EQ(state.bytes(), vae.feature_cache_bytes(1, h, w));
}

TEST(AutoencoderKLWan, FeatureCacheAtWan21Size) {
  const AutoencoderKLWan vae(AutoencoderKLWanConfig::wan21());
  // 832 x 480 video: latent 104 x 60. Full resolution: 7 caches of 2 x 96 x 480 x 832 floats, ...
  const int64_t bytes = vae.feature_cache_bytes(1, 60, 104);
  const int64_t full = 2 * 96 * 480 * 832 * 4, half = 2 * 192 * 240 * 416 * 4, quarter = 2 * 384 * 120 * 208 * 4,
                latent = 2 * 384 * 60 * 104 * 4;
  const int64_t expected = 2 * 16 * 60 * 104 * 4 /*conv_in*/ + 4 * latent /*mid*/ + 6 * latent + latent /*up 0*/ + quarter / 2 +
                           5 * quarter + quarter /*up 1*/ + 6 * half /*up 2*/ + 7 * full /*up 3, conv_out*/;
  EXPECT_EQ(bytes, expected);
  std::printf("[ memory ] Wan2.1 at 832 x 480: feature caches %.2f GB, estimated peak %.2f GB\n", static_cast<double>(bytes) / 1e9,
              static_cast<double>(vae.estimate_peak_bytes(1, 60, 104)) / 1e9);
}

// --- simulate mode ----------------------------------------------------------------------------------

TEST(AutoencoderKLWan, SimulatesWan21At832x480) {
  Device device(builtin_cpu_profile(), {.simulate = true});
  const Stream stream = device.default_stream();
  AutoencoderKLWan vae(AutoencoderKLWanConfig::wan21());
  models::make_meta_parameters(vae.parameters(), DType::bf16);
  std::vector<Shape> shapes;
  vae.decode_frames(
      Tensor::meta({1, 16, 3, 60, 104}, DType::f32),
      [&](const Tensor& frames) {
        EXPECT_FALSE(frames.has_storage());
        shapes.push_back(frames.shape());
      },
      {}, stream);
  device.synchronize();
  EXPECT_EQ(shapes, (std::vector<Shape>{{1, 3, 1, 480, 832}, {1, 3, 4, 480, 832}, {1, 3, 4, 480, 832}}));
  EXPECT_GT(device.stats().kernels, 100u);
}

// --- parity with the PyTorch goldens -----------------------------------------------------------------

// tests/reference/make_wan_reference.py: AutoencoderKLWan's decoder (docs/models.md, "AutoencoderKLWan
// decoder") in float64 torch on bf16-representable weights (wan_tiny/vae), checked there against
// diffusers' frame-by-frame cached decode; results rounded to f32.
TEST(AutoencoderKLWanGolden, DecodeMatchesPyTorch) {
  const SafetensorsFile goldens = SafetensorsFile::open(data_dir() + "goldens_wan.safetensors");
  const auto meta = nlohmann::json::parse(goldens.metadata().at("vae"));
  ASSERT_EQ(meta.at("weights").get<std::string>(), "wan_tiny/vae");
  const AutoencoderKLWan vae = models::load_autoencoder_kl_wan(data_dir() + "wan_tiny/vae");
  const Stream stream = ops::default_op_stream();
  // The pipeline's un-normalization.
  const Tensor z = goldens.tensor("vae.z");
  expect_close_scaled(vae.unnormalize(goldens.tensor("vae.latents"), stream), values(z), 1e-7, "unnormalize");
  // The recorded intermediates of a whole-sequence decode first, so a mismatch says where it starts.
  const auto& m = vae.modules();
  wan_vae::FeatureCache cache = vae.make_feature_cache();
  Tensor x = m.post_quant_conv(z, cache, stream);
  expect_close_scaled(x, values(goldens.tensor("vae.intermediate.post_quant_conv")), 1e-5, "post_quant_conv");
  x = m.conv_in(x, cache, stream);
  expect_close_scaled(x, values(goldens.tensor("vae.intermediate.decoder.conv_in")), 1e-5, "conv_in");
  x = m.mid_block(x, cache, stream);
  expect_close_scaled(x, values(goldens.tensor("vae.intermediate.decoder.mid_block")), 1e-5, "mid_block");
  x = m.up_blocks[0](x, cache, stream);
  expect_close_scaled(x, values(goldens.tensor("vae.intermediate.decoder.up_blocks.0")), 1e-5, "up_blocks.0");
  x = m.up_blocks[1](x, cache, stream);
  expect_close_scaled(x, values(goldens.tensor("vae.intermediate.decoder.up_blocks.1")), 1e-5, "up_blocks.1");
  // The video, frame by frame (diffusers' way) and whole: max abs error <= 1e-4 of max |reference|.
  const Tensor unclamped = goldens.tensor("vae.video_unclamped"), clamped = goldens.tensor("vae.video");
  const Tensor video = vae.decode(z, {}, stream);
  ASSERT_EQ(video.shape(), (Shape{1, 3, 9, 32, 32}));
  ASSERT_EQ(video.shape(), clamped.shape());
  const double err = expect_close_scaled(video, values(clamped), 1e-4, "video");
  const double err_raw = expect_close_scaled(vae.decode(z, {.clamp = false}, stream), values(unclamped), 1e-4, "video unclamped");
  expect_close_scaled(vae.decode(z, {.latent_frames_per_chunk = 0, .clamp = false}, stream), values(unclamped), 1e-4,
                      "video unclamped, whole sequence");
  double scale = 0;
  for (double v : values(unclamped)) scale = std::max(scale, std::fabs(v));
  std::printf("[ golden ] wan_tiny vae: max |error| %.3g (clamped), %.3g (unclamped, max |ref| %.3g); allocator peak %.2f MB\n", err,
              err_raw, scale, static_cast<double>(decode_peak(vae, z)) / 1e6);
  // Stored as bf16 (the weights are bf16-representable, the convs widen them): the same numbers.
  const AutoencoderKLWan half = models::load_autoencoder_kl_wan(data_dir() + "wan_tiny/vae", DType::bf16);
  expect_close_scaled(half.decode(z, {.clamp = false}, stream), values(unclamped), 1e-4, "bf16 weights");
}

}  // namespace autoencoder_kl_wan_test
}  // namespace cubevec
