// `cubevec t2i --image` (FluxImg2ImgPipeline) and `--mask` (FluxInpaintPipeline) on the shipped
// tinyflux: strength 1 without a mask is text-to-image's picture for the same seed, byte for byte;
// strength 0.6 of 10 steps runs 6 (get_timesteps) and lands between the picture and a fresh one;
// inpainting keeps the black part of the mask (within the VAE's round trip: PSNR stated below) and
// repaints the white; and bad images and settings are errors naming them before any weight loads.
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli/run_cubevec.h"
#include "media/png.h"

namespace t2i_image_cli_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec_cli_test;
using T2iImageCli = CliTest;

std::vector<std::string> tinyflux_run(const std::string& prompt, const std::string& out, int steps, int seed) {
  return {"t2i",     "--model", kTinyFlux,  "--prompt", prompt,  "--steps", std::to_string(steps), "--seed", std::to_string(seed),
          "--width", "64",      "--height", "64",       "--out", out};
}

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

std::string bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// PSNR of b against a over the columns [x0, x1) (8-bit RGB, peak 255).
double psnr(const cubevec::media::RgbImage& a, const cubevec::media::RgbImage& b, int x0, int x1) {
  double mse = 0;
  int64_t count = 0;
  for (int y = 0; y < a.height; ++y)
    for (int x = x0; x < x1; ++x)
      for (int c = 0; c < 3; ++c) {
        const std::size_t i = static_cast<std::size_t>((y * a.width + x) * 3 + c);
        mse += std::pow(static_cast<double>(a.pixels[i]) - static_cast<double>(b.pixels[i]), 2);
        ++count;
      }
  mse /= static_cast<double>(count);
  return mse == 0 ? 99.0 : 10 * std::log10(255.0 * 255.0 / mse);
}

const std::string kPrompt = "a large red circle in the center on a blue background";

TEST_F(T2iImageCli, StrengthOneIsTextToImageAndStrengthCutsTheSteps) {
  const fs::path plain = dir_ / "plain.png", full = dir_ / "full.png", partial = dir_ / "partial.png";
  ASSERT_EQ(run(tinyflux_run(kPrompt, plain.string(), 10, 5)).status, 0);
  const std::string picture = (kData / "images" / "photo.jpg").string();
  const Process r = run(with(tinyflux_run(kPrompt, full.string(), 10, 5), {"--image", picture, "--strength", "1"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(bytes_of(full), bytes_of(plain));
  const fs::path report = dir_ / "partial.json";
  const Process p = run(with(tinyflux_run(kPrompt, partial.string(), 10, 5), {"--image", plain.string(), "--json", report.string()}));
  ASSERT_EQ(p.status, 0) << p.err;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(report));
  EXPECT_EQ(j["mode"], "img2img");
  EXPECT_EQ(j["strength"], 0.6);  // diffusers' default
  EXPECT_EQ(j["denoising_steps"], 6);
  EXPECT_EQ(j["step_s"].size(), 6u);
}

// `t2i --edit` (FLUX.1 Kontext on any Flux folder): the picture is a reference, every step runs,
// the size follows --max-area, and the report says so; the library's pixels equal the command line's.
TEST_F(T2iImageCli, EditRunsKontextsPipelineFromTheCommandLine) {
  const fs::path plain = dir_ / "plain.png", edited = dir_ / "edited.png", report = dir_ / "edit.json";
  ASSERT_EQ(run(tinyflux_run(kPrompt, plain.string(), 6, 5)).status, 0);
  const Process r = run({"t2i", "--model", kTinyFlux, "--prompt", "a large yellow square in the center on a blue background", "--steps",
                         "6", "--seed", "3", "--image", plain.string(), "--edit", "--max-area", "2304", "--no-auto-resize", "--out",
                         edited.string(), "--json", report.string()});
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(report));
  EXPECT_EQ(j["mode"], "edit");
  EXPECT_EQ(j["width"], 48);  // 2304 = 48 x 48 at the requested 1:1 (the model's default 64 x 64)
  EXPECT_EQ(j["step_s"].size(), 6u);
  const cubevec::media::RgbImage picture = cubevec::media::read_png(edited.string());
  EXPECT_EQ(picture.width, 48);
  for (const auto& [flags, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--edit"}, "--edit needs --image"},
           {{"--image", plain.string(), "--edit", "--strength", "0.5"}, "--strength applies to image-to-image"},
           {{"--max-area", "4096"}, "--max-area applies to a Kontext edit"}}) {
    const Process bad = run(with(tinyflux_run(kPrompt, (dir_ / "x.png").string(), 2, 1), flags));
    EXPECT_NE(bad.status, 0);
    EXPECT_NE(bad.err.find(message), std::string::npos) << bad.err;
  }
}

TEST_F(T2iImageCli, InpaintingKeepsTheBlackPartAndRepaintsTheWhite) {
  const fs::path picture = dir_ / "picture.png", mask = dir_ / "mask.png", out = dir_ / "out.png";
  ASSERT_EQ(run(tinyflux_run(kPrompt, picture.string(), 8, 3)).status, 0);
  cubevec::media::RgbImage m;
  m.width = m.height = 64;
  m.pixels.assign(64 * 64 * 3, 0);
  for (int y = 0; y < 64; ++y)
    for (int x = 0; x < 32; ++x)
      for (int c = 0; c < 3; ++c) m.pixels[static_cast<std::size_t>((y * 64 + x) * 3 + c)] = 255;  // the left half is repainted
  cubevec::media::write_png(mask.string(), m);
  const Process r = run(with(tinyflux_run("a small green square at the top left on a white background", out.string(), 8, 11),
                             {"--image", picture.string(), "--mask", mask.string(), "--strength", "1"}));
  ASSERT_EQ(r.status, 0) << r.err;
  const cubevec::media::RgbImage before = cubevec::media::read_png(picture.string()), after = cubevec::media::read_png(out.string());
  // Away from the seam (the decoder's reach), the kept half is the picture through the VAE's round
  // trip; the repainted half is a new picture.
  const double kept = psnr(before, after, 44, 64), repainted = psnr(before, after, 0, 20);
  std::printf("inpainting: kept region PSNR %.1f dB, repainted region %.1f dB\n", kept, repainted);
  EXPECT_GT(kept, 30.0);
  EXPECT_LT(repainted, kept - 10.0);
}

TEST_F(T2iImageCli, BadImagesAndSettingsAreErrorsBeforeAnyWeightLoads) {
  const fs::path out = dir_ / "out.png", text = dir_ / "notes.png";
  std::ofstream(text) << "not a picture";
  const std::string picture = (kData / "images" / "rgb.png").string();
  struct Case {
    std::vector<std::string> extra;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"--image", text.string()}, "--image " + text.string() + ": neither a PNG nor a JPEG image"},
      {{"--image", (dir_ / "missing.png").string()}, "--image " + (dir_ / "missing.png").string() + ": cannot open"},
      {{"--image", (kData / "images").string()}, "is a directory"},
      {{"--image", (kData / "images" / "cmyk.jpg").string()}, "a CMYK JPEG"},
      {{"--image", picture, "--strength", "0"}, "0 would run no denoising step"},
      {{"--image", picture, "--strength", "1.5"}, "--strength"},
      {{"--mask", picture}, "--mask needs --image"},
      {{"--strength", "0.5"}, "--strength applies with --image"},
      {{"--image", ""}, "--image: expected a PNG or JPEG file, got an empty path"},
      {{"--image", picture, "--mask", ""}, "--mask: expected a PNG or JPEG file, got an empty path"},
      {{"--image", picture, "--mask", text.string()}, "--mask " + text.string() + ": neither a PNG nor a JPEG image"},
  };
  for (const Case& c : cases) {
    const Process r = run(with(tinyflux_run(kPrompt, out.string(), 4, 1), c.extra));
    EXPECT_NE(r.status, 0) << c.expect;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("loaded"), std::string::npos) << "weights were loaded before the error: " << r.err;
    EXPECT_FALSE(fs::exists(out));
  }
  // Wan2.1 text-to-video takes no picture.
  const Process wan = run({"t2v", "--model", kTinyWan, "--prompt", "a red circle", "--out", (dir_ / "v.avi").string(), "--image", picture});
  EXPECT_NE(wan.status, 0);
}

}  // namespace t2i_image_cli_test
