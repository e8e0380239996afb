// The shipped tiny text-to-image model (assets/tinyflux, trained by tools/tinyflux/train.py) run
// by cubevec's pipeline:
//   * the seeded noise equals tools/tinyflux/sample.py's numpy reimplementation of
//     pipelines/noise.h, so both sides start from the same latents;
//   * parity: the C++ pipeline (text encoder, FlowMatch Euler at the default step count, VAE
//     decode) on the reference prompt and seed gives the image of the PyTorch sampler
//     (tests/data/tinyflux_reference.safetensors) with a PSNR of at least 40 dB;
//   * semantics: for a set of prompts, the dominant background and shape colors of the generated
//     picture are the prompt's (see dominant_colors below).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <map>

#include "pipelines/flux_t2i.h"
#include "media/jpeg.h"
#include "pipelines/noise.h"
#include "pipelines/quality.h"
#include "models/tiny_text_encoder.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace tinyflux_test {  // named after the file: unity batches never mix two files' helpers

const std::string kModel = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";
const std::string kReference = std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/tinyflux_reference.safetensors";

const SafetensorsFile& reference() {
  static const SafetensorsFile file = SafetensorsFile::open(kReference);
  return file;
}

struct TinyFlux {
  pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(kModel);
  std::unique_ptr<models::TinyTextEncoder> text = models::TinyTextEncoder::load(kModel);
};

TinyFlux& model() {
  static TinyFlux m;
  return m;
}

// The decoded image [1, 3, H, W] for `prompt`, as `cubevec t2i` makes it with default options.
Tensor generate(const std::string& prompt, uint64_t seed, int steps = pipelines::T2IOptions{}.steps) {
  TinyFlux& m = model();
  pipelines::T2IOptions o;
  o.width = o.height = m.pipeline.default_image_size();
  o.steps = steps;
  o.seed = seed;
  Device& device = default_device();
  pipelines::T2ITimings timings;
  const pipelines::PromptEmbeddings pos = m.text->encode(prompt);
  const Tensor packed = m.pipeline.denoise(pos, nullptr, o, device, {}, timings);
  return m.pipeline.decode(packed, o, device, timings);
}

TEST(TinyFlux, NoiseMatchesTheNumpyReimplementation) {
  const SafetensorsFile& ref = reference();
  const uint64_t check_seed = std::stoull(ref.metadata().at("noise_check_seed"));
  for (const auto& [name, seed] :
       {std::pair<std::string, uint64_t>{"noise_check", check_seed}, {"noise", std::stoull(ref.metadata().at("seed"))}}) {
    const Tensor want = ref.tensor(name);
    const Tensor got = pipelines::gaussian_noise(want.shape(), seed);
    const auto g = testing::values(got), w = testing::values(want);
    int differ = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      // Bit-exact except where the libm's cos/sin/log and numpy's differ by an ulp in double,
      // which may move the f32 rounding by one ulp.
      EXPECT_LE(std::fabs(g[i] - w[i]), std::ldexp(std::fabs(w[i]), -23) + 1e-30) << name << " element " << i;
      differ += g[i] != w[i];
    }
    EXPECT_LE(differ, 2) << name << ": elements not bit-identical";
  }
}

TEST(TinyFlux, PipelineMatchesThePyTorchSampler) {
  const SafetensorsFile& ref = reference();
  const int steps = std::stoi(ref.metadata().at("steps"));
  ASSERT_EQ(steps, pipelines::T2IOptions{}.steps) << "the reference is made at the CLI's default step count";
  const Tensor image = generate(ref.metadata().at("prompt"), std::stoull(ref.metadata().at("seed")), steps);
  const Tensor want = ref.tensor("image");
  ASSERT_EQ(image.shape(), want.shape());
  const double db = pipelines::compare_pictures(image, want).psnr_db;
  RecordProperty("psnr_db", std::to_string(db));
  std::printf("PSNR of the C++ pipeline against the PyTorch sampler: %.2f dB\n", db);
  EXPECT_GE(db, 40.0);
}

// The training palette (tools/tinyflux/dataset.py PALETTE).
const std::map<std::string, std::array<double, 3>> kPalette = {
    {"red", {220, 40, 40}},  {"orange", {245, 140, 20}}, {"yellow", {245, 220, 40}}, {"green", {40, 170, 60}},
    {"blue", {40, 80, 220}}, {"purple", {140, 60, 190}}, {"white", {245, 245, 245}}, {"black", {20, 20, 20}}};

double distance2(const uint8_t* p, const std::array<double, 3>& c) {
  double d = 0;
  for (int k = 0; k < 3; ++k) d += (p[k] - c[static_cast<std::size_t>(k)]) * (p[k] - c[static_cast<std::size_t>(k)]);
  return d;
}

std::string nearest(const uint8_t* p) {
  std::string best;
  double best_d = INFINITY;
  for (const auto& [name, c] : kPalette)
    if (distance2(p, c) < best_d) {
      best_d = distance2(p, c);
      best = name;
    }
  return best;
}

// Dominant colors, robustly: the background is the majority nearest palette color of the pixels
// within 2 of the border; the shape is the majority nearest palette color of the pixels farther than
// 60 (RGB distance) from the background's palette color. (dataset.dominant_colors in Python.)
std::pair<std::string, std::string> dominant_colors(const media::RgbImage& im) {
  std::map<std::string, int> border, shape;
  for (int y = 0; y < im.height; ++y)
    for (int x = 0; x < im.width; ++x)
      if (y < 2 || y >= im.height - 2 || x < 2 || x >= im.width - 2)
        ++border[nearest(&im.pixels[static_cast<std::size_t>((y * im.width + x) * 3)])];
  auto majority = [](const std::map<std::string, int>& votes) {
    std::string best;
    int n = -1;
    for (const auto& [name, count] : votes)
      if (count > n) {
        n = count;
        best = name;
      }
    return best;
  };
  const std::string background = majority(border);
  for (std::size_t i = 0; i < im.pixels.size(); i += 3)
    if (distance2(&im.pixels[i], kPalette.at(background)) > 60.0 * 60.0) ++shape[nearest(&im.pixels[i])];
  return {background, shape.empty() ? std::string("(none)") : majority(shape)};
}

TEST(TinyFlux, PicturesHaveThePromptsColors) {
  // (prompt, shape color, background color); two seeds each.
  const struct {
    const char* prompt;
    const char* shape;
    const char* background;
  } cases[] = {
      {"a red circle on a blue background", "red", "blue"},
      {"a yellow square on a purple background", "yellow", "purple"},
      {"a large white triangle on a black background", "white", "black"},
      {"a blue circle in the center on an orange background", "blue", "orange"},
      {"two green squares on a white background", "green", "white"},
      {"a black circle on a yellow background", "black", "yellow"},
  };
  for (const auto& c : cases)
    for (uint64_t seed : {0u, 1u}) {
      const media::RgbImage im = media::to_rgb(generate(c.prompt, seed));
      const auto [background, shape] = dominant_colors(im);
      EXPECT_EQ(background, c.background) << "'" << c.prompt << "' seed " << seed;
      EXPECT_EQ(shape, c.shape) << "'" << c.prompt << "' seed " << seed;
    }
}

}  // namespace tinyflux_test
}  // namespace cubevec
