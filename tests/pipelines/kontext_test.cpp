// FLUX.1 Kontext editing (FluxKontextPipeline) against tests/reference/make_kontext_reference.py:
// diffusers' size rules (output rescaled to max_area, the reference's preferred resolution) on 11
// cases exactly; a 4-step edit of the tiny Flux transformer with a whole tiny VAE (reference
// resized by PIL's Lanczos, encoded, appended as tokens with first id 1, the prediction cut back)
// within 1e-4 of the output scale; and through the library on a Kontext folder made of tinyflux:
// the edit runs by model_index.json alone, with the DBCache on, and its errors name the flag.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/tensor_testing.h"
#include "models/flux_transformer.h"
#include "pipelines/flux_t2i.h"
#include "pipelines/image_conditioning.h"
#include "pipelines/pipeline.h"
#include "tensor/safetensors.h"

namespace cubevec {
namespace kontext_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
namespace fs = std::filesystem;

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

Tensor golden(const std::string& name) {
  static const SafetensorsFile file = SafetensorsFile::open(data_path("goldens_kontext.safetensors"));
  return file.tensor(name);
}

// A scratch folder of symbolic links to existing components plus a model_index.json naming
// FluxKontextPipeline.
class KontextFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cubevec_kontext_" + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string make(const std::vector<std::pair<std::string, std::string>>& components) {
    for (const auto& [name, target] : components) fs::create_directory_symlink(target, dir_ / name);
    std::ofstream(dir_ / "model_index.json") << R"({"_class_name": "FluxKontextPipeline", "_diffusers_version": "0.34.0"})";
    return dir_.string();
  }
  fs::path dir_;
};

TEST(Kontext, SizesFollowDiffusersRules) {
  const Tensor table = golden("sizes.table").contiguous();
  ASSERT_EQ(table.size(1), 10);
  for (int64_t i = 0; i < table.size(0); ++i) {
    const auto v = [&](int64_t j) { return static_cast<int64_t>(table.data<float>()[i * 10 + j]); };
    const auto [ow, oh] = pipelines::kontext_output_size(v(2), v(3), v(4), 16);
    const auto [rw, rh] = pipelines::kontext_reference_size(v(0), v(1), v(5) != 0, 8, 16);
    EXPECT_EQ(ow, v(6)) << "case " << i;
    EXPECT_EQ(oh, v(7)) << "case " << i;
    EXPECT_EQ(rw, v(8)) << "case " << i;
    EXPECT_EQ(rh, v(9)) << "case " << i;
  }
  EXPECT_NE(message_of([] { pipelines::kontext_output_size(1000, 10, 300, 16); }).find("--max-area 300"), std::string::npos);
  EXPECT_NE(message_of([] { pipelines::kontext_output_size(16384, 16, int64_t{1} << 28, 16); }).find("sides are at most 16384"),
            std::string::npos);
  // The reference's ids: Flux's grid with the first coordinate 1.
  const std::vector<double> ids = values(pipelines::kontext_reference_ids(4, 6)), grid = values(models::flux_image_ids(4, 6));
  ASSERT_EQ(ids.size(), grid.size());
  for (std::size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], i % 3 == 0 ? 1.0 : grid[i]) << i;
}

TEST_F(KontextFolder, FourStepEditMatchesTheReference) {
  const std::string folder = make({{"transformer", data_path("flux_tiny/transformer")},
                                   {"vae", data_path("vae_encoder/flux")},
                                   {"scheduler", data_path("flux_tiny/scheduler")}});
  const pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(folder);
  EXPECT_TRUE(pipeline.kontext());
  const Tensor pixels = golden("edit.picture").contiguous();
  media::RgbImage picture;
  picture.height = static_cast<int>(pixels.size(0));
  picture.width = static_cast<int>(pixels.size(1));
  for (int64_t i = 0; i < pixels.numel(); ++i) picture.pixels.push_back(static_cast<uint8_t>(pixels.data<float>()[i]));
  pipelines::T2IOptions o;
  o.initial_noise = golden("edit.noise");
  o.width = o.height = 32;
  o.steps = 4;
  o.guidance = 3.5;
  o.edit = true;
  o.auto_resize = false;
  o.image_pixels = std::make_shared<const media::RgbImage>(picture);
  const pipelines::PromptEmbeddings pos{golden("edit.encoder_hidden_states"), golden("edit.pooled_projections")};
  Device& device = default_device();
  pipelines::T2ITimings timings;
  const Tensor packed = pipeline.denoise(pos, nullptr, o, device, {}, timings);
  ASSERT_EQ(packed.size(1), 16);  // the latents' tokens only: the reference's 12 are cut off
  expect_close_rel(models::unpack_latents(packed, 8, 8, device.default_stream()), golden("edit.expected_latents"), 1e-4, "edited latents");
  expect_close_rel(pipeline.decode(packed, o, device, timings), golden("edit.expected"), 1e-4, "decoded edit");
  // A reference too small, or (keeping its own size) too large beside the output, fails in check().
  const auto flat = [](int w, int h) {
    media::RgbImage p;
    p.width = w;
    p.height = h;
    p.pixels.assign(static_cast<std::size_t>(w * h * 3), 128);
    return std::make_shared<const media::RgbImage>(p);
  };
  pipelines::T2IOptions bad = o;
  bad.image_pixels = flat(3, 3);
  EXPECT_NE(message_of([&] { pipeline.check(bad, false); }).find("needs at least 8 pixels a side"), std::string::npos);
  bad.image_pixels = flat(1100, 1000);
  EXPECT_NE(message_of([&] { pipeline.check(bad, false); }).find("or leave auto-resize on"), std::string::npos);
  bad.auto_resize = true;
  EXPECT_NO_THROW(pipeline.check(bad, false));  // resized to a preferred resolution, it is accepted
  // Without the reference (plain text-to-image from the same noise) the latents differ.
  o.edit = false;
  o.image_pixels.reset();
  const Tensor plain = models::unpack_latents(pipeline.denoise(pos, nullptr, o, device, {}, timings), 8, 8, device.default_stream());
  const std::vector<double> a = values(plain), b = values(golden("edit.expected_latents"));
  double diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(a[i] - b[i]));
  EXPECT_GT(diff, 0.1);
}

TEST_F(KontextFolder, AModelIndexThatCannotBeReadIsAnError) {
  fs::create_symlink(dir_ / "loop_a", dir_ / "loop_b");
  fs::create_symlink(dir_ / "loop_b", dir_ / "loop_a");
  fs::create_symlink(dir_ / "loop_a", dir_ / "model_index.json");
  EXPECT_NE(message_of([&] { pipelines::names_kontext_pipeline(dir_.string()); }).find("model_index.json"), std::string::npos);
  fs::remove(dir_ / "model_index.json");
  EXPECT_FALSE(pipelines::names_kontext_pipeline(dir_.string()));  // no file: not a Kontext folder
  std::ofstream(dir_ / "model_index.json") << R"({"_class_name": "FluxPipeline"})";
  EXPECT_FALSE(pipelines::names_kontext_pipeline(dir_.string()));
  std::ofstream(dir_ / "model_index.json") << R"({"_class_name": 5})";
  EXPECT_NE(message_of([&] { pipelines::names_kontext_pipeline(dir_.string()); }).find("must be a string"), std::string::npos);
}

TEST_F(KontextFolder, TheLibraryEditsOnAKontextFolderWithTheDbCache) {
  const std::string tiny = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";
  std::vector<std::pair<std::string, std::string>> parts;
  for (const char* c : {"transformer", "vae", "scheduler", "text_encoder", "tokenizer"}) parts.push_back({c, tiny + "/" + c});
  const std::string folder = make(parts);
  const std::unique_ptr<pipelines::Pipeline> plain = pipelines::Pipeline::load(tiny);
  const media::RgbImage source =
      plain->generate(pipelines::Request::parse(R"({"prompt": "a large red circle in the center on a blue background", "seed": 1})"))
          .images.at(0);
  const std::unique_ptr<pipelines::Pipeline> kontext = pipelines::Pipeline::load(folder);
  const auto edit = [&](const std::string& extra) {
    pipelines::Request r = pipelines::Request::parse(
        R"({"prompt": "a large yellow square in the center on a blue background", "num_inference_steps": 8, "seed": 2,
            "max_area": 4096)" +
        extra + "}");
    r.image_pixels = std::make_shared<const media::RgbImage>(source);
    return kontext->generate(r);
  };
  const pipelines::GenerationResult dense = edit(R"(, "auto_resize": false)");
  EXPECT_EQ(dense.report["mode"], "edit");
  EXPECT_TRUE(dense.request.edit.value_or(false));  // by model_index.json alone
  EXPECT_EQ(*dense.request.width, 64);
  EXPECT_EQ(*dense.request.height, 64);
  ASSERT_EQ(dense.images.size(), 1u);
  // The DBCache over the longer sequence: some blocks skipped, the picture close to the dense edit.
  const pipelines::GenerationResult cached = edit(R"(, "auto_resize": false, "cache": {"cache": "db", "cache-fn": 1, "cache-bn": 0,
                                                      "cache-threshold": 0.5, "cache-warmup": 2})");
  int computed = 0, calls = 0;
  for (const pipelines::StepCounts& c : cached.stages.step_counts()) computed += c.blocks_computed, calls += c.block_calls;
  EXPECT_LT(computed, calls) << "the DBCache skipped nothing";
  double mse = 0;
  const auto& x = dense.images[0].pixels;
  const auto& y = cached.images[0].pixels;
  ASSERT_EQ(x.size(), y.size());
  for (std::size_t i = 0; i < x.size(); ++i) mse += std::pow(double(x[i]) - double(y[i]), 2) / static_cast<double>(x.size());
  const double psnr = 10 * std::log10(255.0 * 255.0 / std::max(mse, 1e-9));
  std::printf("[ kontext ] tinyflux edit with the DBCache: %d of %d block computations, PSNR %.1f dB against the dense edit\n", computed,
              calls, psnr);
  EXPECT_GT(psnr, 20.0);
  // The edit differs from text-to-image with the same prompt and seed, and from the picture it edits.
  const pipelines::GenerationResult t2i = plain->generate(pipelines::Request::parse(
      R"({"prompt": "a large yellow square in the center on a blue background", "num_inference_steps": 8, "seed": 2})"));
  EXPECT_NE(t2i.images[0].pixels, dense.images[0].pixels);
  // Errors name the flag: a mask or strength with an edit; max_area without one.
  const std::string with_strength = R"(, "strength": 0.5)";
  EXPECT_NE(message_of([&] { edit(with_strength); }).find("strength"), std::string::npos);
  EXPECT_NE(message_of([&] {
              plain->generate(pipelines::Request::parse(R"({"prompt": "a red circle", "max_area": 4096})"));
            }).find("applies to a Kontext edit"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              plain->generate(pipelines::Request::parse(R"({"prompt": "a red circle", "edit": true})"));
            }).find("--edit needs --image"),
            std::string::npos);
}

}  // namespace kontext_test
}  // namespace cubevec
