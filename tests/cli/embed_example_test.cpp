// examples/embed.c, the C program that embeds cubevec through include/cubevec.h, renders the
// README's prompt; its pixels must be `cubevec t2i`'s for the same request (the JPEG of its
// pixels is byte for byte the JPEG the command wrote).
#include <gtest/gtest.h>

#include "cli/run_cubevec.h"
#include "media/jpeg.h"

namespace embed_example_test {

using namespace cubevec_cli_test;

const char* const kReadmePrompt = "a large red circle in the center on a blue background";

// A binary PPM (P6, maxval 255) as RGB.
cubevec::media::RgbImage read_ppm(const std::string& path) {
  const std::string bytes = read_file(path);
  int width = 0, height = 0, maxval = 0, consumed = 0;
  cubevec::media::RgbImage image;
  if (std::sscanf(bytes.c_str(), "P6 %d %d %d%n", &width, &height, &maxval, &consumed) != 3 || maxval != 255) return image;
  const std::size_t size = static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3;
  if (bytes.size() != static_cast<std::size_t>(consumed) + 1 + size) return image;
  image.width = width;
  image.height = height;
  image.pixels.assign(bytes.end() - static_cast<std::ptrdiff_t>(size), bytes.end());
  return image;
}

class EmbedExample : public CliTest {};

TEST_F(EmbedExample, RendersTheReadmePromptWithTheCommandsPixels) {
  const std::string ppm = (dir_ / "embed.ppm").string(), jpg = (dir_ / "t2i.jpg").string();
  const Process embed = run_program({CUBEVEC_EMBED_EXAMPLE, kTinyFlux, ppm, kReadmePrompt}, dir_);
  ASSERT_EQ(embed.status, 0) << embed.err;
  EXPECT_NE(embed.err.find("step 28/28"), std::string::npos) << embed.err;
  const auto t2i = run({"t2i", "--model", kTinyFlux, "--prompt", kReadmePrompt, "--out", jpg});
  ASSERT_EQ(t2i.status, 0) << t2i.err;
  const cubevec::media::RgbImage image = read_ppm(ppm);
  ASSERT_EQ(image.width, 64);
  ASSERT_EQ(image.height, 64);
  const std::vector<uint8_t> encoded = cubevec::media::encode_jpeg(image, 92);
  EXPECT_EQ(std::string(encoded.begin(), encoded.end()), read_file(jpg));
}

TEST_F(EmbedExample, ReportsAMissingModelAndExitsNonZero) {
  const Process embed = run_program({CUBEVEC_EMBED_EXAMPLE, (dir_ / "missing").string(), (dir_ / "x.ppm").string()}, dir_);
  EXPECT_EQ(embed.status, 1);
  EXPECT_NE(embed.err.find("missing: no such model folder"), std::string::npos) << embed.err;
  EXPECT_FALSE(fs::exists(dir_ / "x.ppm"));
}

}  // namespace embed_example_test
