// The seeded noise generator (deterministic, a function of (seed, index), standard normal) and the
// JPEG writer (a file TurboJPEG reads back to nearly the same pixels), with their errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "media/jpeg.h"
#include "pipelines/noise.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace noise_jpeg_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

TEST(GaussianNoise, DeterministicPrefixStableAndStandardNormal) {
  const auto a = values(pipelines::gaussian_noise({2, 16, 64, 64}, 42));
  EXPECT_EQ(a, values(pipelines::gaussian_noise({2, 16, 64, 64}, 42)));
  const auto longer = values(pipelines::gaussian_noise({3, 16, 64, 64}, 42));
  EXPECT_TRUE(std::equal(a.begin(), a.end(), longer.begin())) << "a larger tensor extends a smaller one";
  const auto other = values(pipelines::gaussian_noise({2, 16, 64, 64}, 43));
  int same = 0;
  for (std::size_t i = 0; i < a.size(); ++i) same += a[i] == other[i];
  EXPECT_LT(same, 10);
  // 131072 samples: mean and variance within 5 standard errors, tails of the right size.
  double sum = 0, sq = 0;
  int beyond2 = 0;
  for (double x : a) {
    sum += x;
    sq += x * x;
    beyond2 += std::fabs(x) > 2.0;
  }
  const double n = static_cast<double>(a.size()), mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 5.0 / std::sqrt(n));
  EXPECT_NEAR(var, 1.0, 5.0 * std::sqrt(2.0 / n));
  EXPECT_NEAR(beyond2 / n, 0.0455, 0.003);
}

TEST(Jpeg, WrittenFileDecodesToTheImage) {
  const std::string path = (std::filesystem::temp_directory_path() / ("cubevec_jpeg_" + std::to_string(::getpid()) + ".jpg")).string();
  // A smooth gradient image in [-1, 1] with a few clamped values.
  const int64_t h = 40, w = 56;
  std::vector<float> v(static_cast<std::size_t>(3 * h * w));
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        v[static_cast<std::size_t>((c * h + y) * w + x)] =
            -1.2f + 2.4f * static_cast<float>(x + y + 10 * c) / static_cast<float>(w + h + 20);
  const Tensor image = Tensor::from_vector(v, {1, 3, h, w});
  const media::RgbImage rgb = media::to_rgb(image);
  ASSERT_EQ(rgb.width, w);
  ASSERT_EQ(rgb.height, h);
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t c = 0; c < 3; ++c) {
        const double want = std::round(std::clamp(v[static_cast<std::size_t>((c * h + y) * w + x)] * 0.5 + 0.5, 0.0, 1.0) * 255.0);
        ASSERT_EQ(rgb.pixels[static_cast<std::size_t>((y * w + x) * 3 + c)], want) << x << "," << y << "," << c;
      }
  media::write_jpeg(path, rgb, 95);
  const media::RgbImage back = media::read_jpeg(path);
  ASSERT_EQ(back.width, w);
  ASSERT_EQ(back.height, h);
  double max_err = 0;
  for (std::size_t i = 0; i < back.pixels.size(); ++i) max_err = std::max(max_err, std::fabs(double(back.pixels[i]) - rgb.pixels[i]));
  EXPECT_LE(max_err, 8.0) << "quality 95 on a smooth gradient";
  std::filesystem::remove(path);
  EXPECT_NE(message_of([&] { media::write_jpeg(path, rgb, 0); }).find("quality must be in 1..100"), std::string::npos);
  EXPECT_NE(message_of([&] {
              media::to_rgb(Tensor::from_vector(v, {3, h, w}));
            }).find("expected an image [1, 3, H, W]"),
            std::string::npos);
  EXPECT_NE(message_of([&] { media::write_jpeg("/nonexistent-dir/x.jpg", rgb); }).find("/nonexistent-dir/x.jpg"), std::string::npos);
  const std::string not_jpeg = path + ".txt";
  std::ofstream(not_jpeg) << "hello";
  EXPECT_NE(message_of([&] { media::read_jpeg(not_jpeg); }).find("not a JPEG file"), std::string::npos);
  std::filesystem::remove(not_jpeg);
}

}  // namespace noise_jpeg_test
}  // namespace cubevec
