// The AutoencoderKL encoder against PyTorch goldens (tests/data/goldens_vae_encoder.safetensors and the
// whole tiny VAEs in tests/data/vae_encoder/, written by tests/reference/make_vae_encoder_reference.py
// from diffusers' source): the Flux-like VAE (no quant conv) and the SD-like one (quant_conv, two
// resnets per block, a batch of 2), each whole and in diffusers' tiles; the latent distribution;
// the tiled encoder's blending against a plain loop; an encode/decode round trip on the shipped
// tinyflux VAE (PSNR stated); and the loader's and the encoder's errors.
//
// Tolerance (the issue's): max |got - expected| <= 1e-4 * max |expected| (the goldens are float64 runs
// rounded to f32).
#include "models/autoencoder_kl_encoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/tensor_testing.h"
#include "ops/vector_ops.h"
#include "tensor/safetensors.h"

namespace cubevec {
namespace autoencoder_kl_encoder_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

const SafetensorsFile& goldens() {
  static const SafetensorsFile file = SafetensorsFile::open(data_path("goldens_vae_encoder.safetensors"));
  return file;
}

Tensor golden(const std::string& name) { return goldens().tensor(name); }

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = values(a), y = values(b);
  double m = 0;
  for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

TEST(AutoencoderKLEncoder, WholeAndTiledEncodesMatchDiffusers) {
  const Stream s = ops::default_op_stream();
  for (const std::string vae : {"flux", "sd"}) {
    const models::AutoencoderKLEncoder encoder = models::load_autoencoder_kl_encoder(data_path("vae_encoder/" + vae));
    const std::string whole = vae + "_whole", tiled = vae + "_tiled";
    expect_close_rel(encoder.moments(golden(whole + ".sample"), s), golden(whole + ".expected_moments"), 1e-4, whole);
    // moments_tiled encodes an image no larger than sample_size whole, and a larger one in tiles.
    expect_close_rel(encoder.moments_tiled(golden(whole + ".sample"), s), golden(whole + ".expected_moments"), 1e-4, whole + " (tiled)");
    expect_close_rel(encoder.moments_tiled(golden(tiled + ".sample"), s), golden(tiled + ".expected_moments"), 1e-4, tiled);
    const models::LatentDistribution d = encoder.encode(golden(whole + ".sample"), s);
    expect_close_rel(d.mean, golden(whole + ".expected_mean"), 1e-4, whole + " mean");
    // A tiled encode differs from the whole one (the tiles see less context): the goldens tell them apart.
    const Tensor whole_of_tiled_image = encoder.moments(golden(tiled + ".sample"), s);
    EXPECT_GT(max_abs_diff(whole_of_tiled_image, golden(tiled + ".expected_moments")), 1e-3) << tiled;
  }
}

TEST(AutoencoderKLEncoder, TheDistributionSplitsClampsAndSamples) {
  const Tensor moments = Tensor::from_vector(std::vector<float>{1, 2, -50, 0.5f}, {1, 2, 1, 2});
  const models::LatentDistribution d = models::latent_distribution(moments);
  EXPECT_EQ(values(d.mean), (std::vector<double>{1, 2}));
  EXPECT_EQ(values(d.logvar), (std::vector<double>{-30, 0.5}));  // clamped to [-30, 20] as diffusers
  const Tensor noise = Tensor::from_vector(std::vector<float>{2, -1}, {1, 1, 1, 2});
  const std::vector<double> got = values(d.sample(noise));
  EXPECT_NEAR(got[0], 1 + std::exp(-15.0) * 2, 1e-6);
  EXPECT_NEAR(got[1], 2 - std::exp(0.25), 1e-6);
  EXPECT_THROW(d.sample(Tensor::from_vector(std::vector<float>{1}, {1, 1, 1, 1})), Error);
}

// A 1-channel "encoder" that averages 2x2 blocks lets the tiles' blend be checked against a plain
// loop of diffusers' blend_v / blend_h and crop.
TEST(AutoencoderKLEncoder, TileBlendingAsDiffusers) {
  const int64_t h = 20, w = 14, tile = 8, step = 6, down = 2, blend = 1, keep = 3;
  std::vector<float> image(static_cast<std::size_t>(h * w));
  for (std::size_t i = 0; i < image.size(); ++i) image[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i)));
  const Tensor x = Tensor::from_vector(image, {1, 1, h, w});
  // The tile encoder: 2x2 means plus the tile's origin, so neighbouring tiles differ where they overlap.
  const auto encode_tile = [&](const Tensor& t) {
    const Tensor c = t.contiguous();
    const int64_t th = c.size(2) / down, tw = c.size(3) / down;
    Tensor out = Tensor::empty({1, 1, th, tw}, DType::f32);
    const float* p = c.data<float>();
    const float origin = static_cast<float>(t.offset() % w + t.offset() / w) * 0.01f;
    for (int64_t y = 0; y < th; ++y)
      for (int64_t xx = 0; xx < tw; ++xx)
        out.mutable_data<float>()[y * tw + xx] = 0.25f * (p[(2 * y) * c.size(3) + 2 * xx] + p[(2 * y) * c.size(3) + 2 * xx + 1] +
                                                          p[(2 * y + 1) * c.size(3) + 2 * xx] + p[(2 * y + 1) * c.size(3) + 2 * xx + 1]) +
                                                 origin;
    return out;
  };
  const Tensor got = models::vae::encode_in_tiles(x, tile, step, down, blend, keep, encode_tile, ops::default_op_stream());
  // The plain loop: every tile encoded, blended with the blended upper / left tiles, cropped, concatenated.
  std::vector<std::vector<std::vector<double>>> tiles;  // [row][col] -> flattened latent tile
  std::vector<std::vector<std::pair<int64_t, int64_t>>> dims;
  for (int64_t i = 0; i < h; i += step) {
    tiles.emplace_back();
    dims.emplace_back();
    for (int64_t j = 0; j < w; j += step) {
      const Tensor t = encode_tile(x.narrow(2, i, std::min(tile, h - i)).narrow(3, j, std::min(tile, w - j)));
      tiles.back().push_back(values(t));
      dims.back().push_back({t.size(2), t.size(3)});
    }
  }
  for (std::size_t r = 0; r < tiles.size(); ++r)
    for (std::size_t c = 0; c < tiles[r].size(); ++c) {
      auto& b = tiles[r][c];
      const auto [bh, bw] = dims[r][c];
      if (r > 0) {
        const auto& a = tiles[r - 1][c];
        const auto [ah, aw] = dims[r - 1][c];
        const int64_t e = std::min({ah, bh, blend});
        const double ed = static_cast<double>(e);
        for (int64_t y = 0; y < e; ++y)
          for (int64_t xx = 0; xx < bw; ++xx)
            b[y * bw + xx] =
                a[(ah - e + y) * aw + xx] * (1.0 - static_cast<double>(y) / ed) + b[y * bw + xx] * (static_cast<double>(y) / ed);
      }
      if (c > 0) {
        const auto& a = tiles[r][c - 1];
        const auto [ah, aw] = dims[r][c - 1];
        const int64_t e = std::min({aw, bw, blend});
        const double ed = static_cast<double>(e);
        for (int64_t y = 0; y < bh; ++y)
          for (int64_t xx = 0; xx < e; ++xx)
            b[y * bw + xx] =
                a[y * aw + aw - e + xx] * (1.0 - static_cast<double>(xx) / ed) + b[y * bw + xx] * (static_cast<double>(xx) / ed);
      }
    }
  std::vector<double> want;
  int64_t rows = 0;
  for (std::size_t r = 0; r < tiles.size(); ++r) {
    const int64_t kh = std::min(keep, dims[r][0].first);
    for (int64_t y = 0; y < kh; ++y)
      for (std::size_t c = 0; c < tiles[r].size(); ++c) {
        const int64_t kw = std::min(keep, dims[r][c].second);
        for (int64_t xx = 0; xx < kw; ++xx) want.push_back(tiles[r][c][y * dims[r][c].second + xx]);
      }
    rows += kh;
  }
  ASSERT_EQ(got.size(2), rows);
  const std::vector<double> g = values(got);
  ASSERT_EQ(g.size(), want.size());
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], want[i], 1e-6) << i;
}

// The shipped tinyflux VAE: an image encoded (the mean) and decoded again comes back close.
TEST(AutoencoderKLEncoder, TinyfluxRoundTrip) {
  const std::string dir = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux/vae";
  const models::AutoencoderKLEncoder encoder = models::load_autoencoder_kl_encoder(dir);
  const models::AutoencoderKLDecoder decoder = models::load_autoencoder_kl(dir);
  // A smooth picture in tinyflux's world: a red disc on a blue background, in [-1, 1].
  const int64_t size = 64;
  std::vector<float> image(static_cast<std::size_t>(3 * size * size));
  for (int64_t y = 0; y < size; ++y)
    for (int64_t x = 0; x < size; ++x) {
      const bool disc = std::hypot(static_cast<double>(x) - 32, static_cast<double>(y) - 32) < 16;
      const float rgb[3] = {disc ? 0.9f : -0.8f, -0.8f, disc ? -0.8f : 0.7f};
      for (int c = 0; c < 3; ++c) image[static_cast<std::size_t>((c * size + y) * size + x)] = rgb[c];
    }
  const Tensor x = Tensor::from_vector(image, {1, 3, size, size});
  const std::vector<double> a = values(x);
  const auto psnr_of = [&](const Tensor& latent) {
    const std::vector<double> b = values(decoder.decode(latent));
    double mse = 0;
    for (std::size_t i = 0; i < a.size(); ++i) mse += std::pow(std::clamp(b[i], -1.0, 1.0) - a[i], 2) / static_cast<double>(a.size());
    return 10 * std::log10(4.0 / mse);  // peak-to-peak 2 in [-1, 1]
  };
  const models::LatentDistribution d = encoder.encode(x);
  const double round_trip = psnr_of(d.mean), blank = psnr_of(Tensor::zeros(d.mean.shape(), DType::f32));
  std::printf("tinyflux VAE encode/decode round trip: PSNR %.1f dB (a zero latent decodes to %.1f dB)\n", round_trip, blank);
  // The shipped tiny VAE (4 latent channels, 16-32 wide) gives 18.7 dB: a disc on a background comes
  // back recognisably, far above what a latent without the picture gives.
  EXPECT_GT(round_trip, 17.0);
  EXPECT_GT(round_trip, blank + 8.0);
}

TEST(AutoencoderKLEncoder, ErrorsNameTheProblem) {
  const models::AutoencoderKLEncoder encoder = models::load_autoencoder_kl_encoder(data_path("vae_encoder/flux"));
  const auto message = [&](const Tensor& x) { return message_of([&] { encoder.moments(x); }); };
  EXPECT_NE(message(Tensor::zeros({1, 3, 30, 32}, DType::f32)).find("multiples of 4"), std::string::npos);
  EXPECT_NE(message(Tensor::zeros({1, 4, 32, 32}, DType::f32)).find("[B, 3, H, W]"), std::string::npos);
  EXPECT_NE(message(Tensor::zeros({1, 3, 32, 32}, DType::i32)).find("f32 or bf16"), std::string::npos);
  // The decoder-only checkpoints of the Flux goldens have no encoder: the loader lists what is missing.
  try {
    models::load_autoencoder_kl_encoder(data_path("flux_tiny/vae"));
    FAIL() << "a checkpoint without encoder weights loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("encoder.conv_in.weight"), std::string::npos) << e.what();
  }
  // A config whose encoder blocks are not DownEncoderBlock2D is refused naming the key.
  nlohmann::json config = nlohmann::json::parse(std::ifstream(data_path("vae_encoder/flux/config.json")));
  config["down_block_types"][1] = "AttnDownEncoderBlock2D";
  EXPECT_THROW(models::AutoencoderKLConfig::from_json(config, "config.json"), Error);
}

}  // namespace autoencoder_kl_encoder_test
}  // namespace cubevec
