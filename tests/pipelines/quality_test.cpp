// pipelines/quality.h's comparison of 8-bit pixels (the best-path search's quality bound):
// hand-computed PSNR and largest difference, and mismatched inputs named.
#include <gtest/gtest.h>

#include <cmath>

#include "pipelines/quality.h"

namespace cubevec {
namespace quality_test {  // named after the file: unity batches never mix two files' helpers

media::RgbImage image(int width, int height, uint8_t value) {
  return {width, height, std::vector<uint8_t>(static_cast<std::size_t>(width * height * 3), value)};
}

TEST(ComparePixels, HandComputedPsnrAndLargestDifference) {
  const std::vector<media::RgbImage> a = {image(2, 1, 100), image(2, 1, 7)};
  EXPECT_TRUE(std::isinf(pipelines::compare_pixels(a, a).psnr_db));
  EXPECT_EQ(pipelines::compare_pixels(a, a).max_abs, 0.0);
  std::vector<media::RgbImage> b = a;
  b[1].pixels[4] = 7 + 51;  // one value of 12 off by 0.2: MSE 0.04 / 12, PSNR 10 log10(300)
  const pipelines::Quality q = pipelines::compare_pixels(a, b);
  EXPECT_NEAR(q.psnr_db, 10.0 * std::log10(300.0), 1e-9);
  EXPECT_NEAR(q.max_abs, 0.2, 1e-12);
}

TEST(ComparePixels, MismatchedInputsAreNamed) {
  const std::vector<media::RgbImage> one = {image(2, 2, 0)}, two = {image(2, 2, 0), image(2, 2, 0)}, wide = {image(4, 1, 0)};
  try {
    pipelines::compare_pixels(one, two);
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("1 and 2 frames"), std::string::npos) << e.what();
  }
  try {
    pipelines::compare_pixels(one, wide);
    ADD_FAILURE() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("frame 0 is 2x2 against 4x1"), std::string::npos) << e.what();
  }
}

}  // namespace quality_test
}  // namespace cubevec
