// The AutoencoderKLWan encoder against PyTorch goldens (tests/data/goldens_wan_vae_encoder.safetensors
// and the whole tiny VAEs in tests/data/vae_encoder/wan*, written by
// tests/reference/make_wan_vae_encoder_reference.py from diffusers' source): one frame, nine frames
// in a batch of 2 (three chunks through the caches), another block layout (time downsampled in the
// first two levels), diffusers' tiled encode; the pipelines' normalization against a plain loop;
// and the encoder's errors.
//
// Tolerance (the issue's): max |got - expected| <= 1e-4 * max |expected| (float64 goldens rounded to f32).
#include "models/autoencoder_kl_wan_encoder.h"

#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "common/tensor_testing.h"

namespace cubevec {
namespace autoencoder_kl_wan_encoder_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

Tensor golden(const std::string& name) {
  static const SafetensorsFile file = SafetensorsFile::open(data_path("goldens_wan_vae_encoder.safetensors"));
  return file.tensor(name);
}

TEST(AutoencoderKLWanEncoder, ChunkedEncodesMatchDiffusers) {
  const Stream s = ops::default_op_stream();
  for (const auto& [vae, cases] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{{"wan", {"one_frame", "nine_frames"}}, {"wan_b", {"nine_frames"}}}) {
    const models::AutoencoderKLWanEncoder encoder = models::load_autoencoder_kl_wan_encoder(data_path("vae_encoder/" + vae));
    for (const std::string& c : cases) {
      const std::string name = vae + "_" + c;
      expect_close_rel(encoder.moments(golden(name + ".sample"), {}, s), golden(name + ".expected_moments"), 1e-4, name);
      expect_close_rel(encoder.encode(golden(name + ".sample"), {}, s).mean, golden(name + ".expected_mean"), 1e-4, name + " mean");
      // Tiling on with tiles larger than the video: the whole encode.
      models::WanEncodeOptions tiled;
      tiled.tiling = true;
      expect_close_rel(encoder.moments(golden(name + ".sample"), tiled, s), golden(name + ".expected_moments"), 1e-4,
                       name + " (tiling on)");
    }
  }
}

TEST(AutoencoderKLWanEncoder, TiledEncodeMatchesDiffusers) {
  const models::AutoencoderKLWanEncoder encoder = models::load_autoencoder_kl_wan_encoder(data_path("vae_encoder/wan"));
  models::WanEncodeOptions options;
  options.tiling = true;
  options.tile_sample_min = 32;
  options.tile_sample_stride = 24;
  const Tensor sample = golden("wan_tiled.sample"), want = golden("wan_tiled.expected_moments");
  expect_close_rel(encoder.moments(sample, options), want, 1e-4, "tiled");
  // The whole encode of the same video differs where the tiles meet: the golden tells them apart.
  const std::vector<double> whole = values(encoder.moments(sample)), tiled = values(want);
  double diff = 0;
  for (std::size_t i = 0; i < whole.size(); ++i) diff = std::max(diff, std::fabs(whole[i] - tiled[i]));
  EXPECT_GT(diff, 1e-2);
}

TEST(AutoencoderKLWanEncoder, NormalizeAsThePipeline) {
  const models::AutoencoderKLWanEncoder encoder = models::load_autoencoder_kl_wan_encoder(data_path("vae_encoder/wan_b"));
  const Tensor latents = golden("wan_b_nine_frames.expected_mean");
  const std::vector<double> got = values(encoder.normalize(latents)), in = values(latents);
  const std::vector<double>& mean = encoder.config().latents_mean;
  const std::vector<double>& std_ = encoder.config().latents_std;
  const int64_t per_channel = latents.numel() / (latents.size(0) * latents.size(1));
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::size_t c = static_cast<std::size_t>((static_cast<int64_t>(i) / per_channel) % latents.size(1));
    const float want = (static_cast<float>(in[i]) - static_cast<float>(mean[c])) * (1.0f / static_cast<float>(std_[c]));
    EXPECT_FLOAT_EQ(static_cast<float>(got[i]), want) << i;
  }
}

TEST(AutoencoderKLWanEncoder, ErrorsNameTheProblem) {
  const models::AutoencoderKLWanEncoder encoder = models::load_autoencoder_kl_wan_encoder(data_path("vae_encoder/wan"));
  const auto message = [&](const Tensor& x, const models::WanEncodeOptions& o = {}) { return message_of([&] { encoder.moments(x, o); }); };
  EXPECT_NE(message(Tensor::zeros({1, 3, 4, 16, 16}, DType::f32)).find("1 + 4k frames"), std::string::npos);
  EXPECT_NE(message(Tensor::zeros({1, 3, 1, 12, 16}, DType::f32)).find("multiples of 8"), std::string::npos);
  EXPECT_NE(message(Tensor::zeros({1, 3, 16, 16}, DType::f32)).find("[B, 3, T, H, W]"), std::string::npos);
  EXPECT_NE(message(Tensor::zeros({1, 3, 1, 16, 16}, DType::i32)).find("f32 or bf16"), std::string::npos);
  models::WanEncodeOptions bad;
  bad.tiling = true;
  bad.tile_sample_min = 12;
  EXPECT_NE(message(Tensor::zeros({1, 3, 1, 16, 16}, DType::f32), bad).find("multiples of 8"), std::string::npos);
  // The tiny decoder checkpoint holds only conv_in and quant_conv of the encoder: the rest is listed.
  const std::string missing = message_of([] { models::load_autoencoder_kl_wan_encoder(data_path("wan_tiny/vae")); });
  EXPECT_NE(missing.find("encoder.down_blocks.0.conv1.weight"), std::string::npos) << missing;
  // Configs the encoder cannot run, named by key.
  nlohmann::json config = nlohmann::json::parse(std::ifstream(data_path("vae_encoder/wan/config.json")));
  config["attn_scales"] = {1.0};
  const models::AutoencoderKLWanConfig with_attention = models::AutoencoderKLWanConfig::from_json(config, "config.json");
  EXPECT_NE(message_of([&] { models::AutoencoderKLWanEncoder{with_attention}; }).find("attn_scales"), std::string::npos);
}

}  // namespace autoencoder_kl_wan_encoder_test
}  // namespace cubevec
