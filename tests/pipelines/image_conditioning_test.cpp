// Flux's image-to-image and inpainting pieces (pipelines/image_conditioning.h) against diffusers'
// rules written here as plain loops: get_timesteps' start for several step counts and strengths, the
// scheduler cut there (timesteps[t_start:]), scale_noise, PIL's convert("L") on known colours, and
// the inpainting mask's binarization and nearest resize to the latent.
#include "pipelines/image_conditioning.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/tensor_testing.h"
#include "media/image_input.h"
#include "pipelines/flow_match.h"

namespace cubevec {
namespace image_conditioning_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

// diffusers' get_timesteps, as a plain loop: init_timestep = min(N * strength, N),
// t_start = int(max(N - init_timestep, 0)).
int diffusers_start(int steps, double strength) {
  const double init = std::min(steps * strength, static_cast<double>(steps));
  return static_cast<int>(std::max(steps - init, 0.0));
}

TEST(ImageConditioning, StartStepAsGetTimesteps) {
  for (int steps : {1, 2, 4, 10, 28, 50})
    for (double strength : {1.0, 0.95, 0.75, 0.6, 0.5, 0.35, 0.1, 0.01})
      EXPECT_EQ(pipelines::img2img_start_step(steps, strength), diffusers_start(steps, strength)) << steps << " " << strength;
  EXPECT_EQ(pipelines::img2img_start_step(28, 0.6), 11);  // 17 steps run, as FluxImg2ImgPipeline's default
  EXPECT_EQ(pipelines::img2img_start_step(10, 0.35), 6);
  EXPECT_NE(message_of([] { pipelines::img2img_start_step(10, 0.0); }).find("0 would run no denoising step"), std::string::npos);
  EXPECT_NE(message_of([] { pipelines::img2img_start_step(10, 1.5); }).find("--strength must be in (0, 1]"), std::string::npos);
  EXPECT_NE(message_of([] { pipelines::img2img_start_step(10, std::nan("")); }).find("--strength"), std::string::npos);
}

TEST(ImageConditioning, TheScheduleStartsThereAndNoiseIsScaledToItsSigma) {
  pipelines::FlowMatchConfig config;
  config.shift = 3.0;
  config.use_dynamic_shifting = true;
  pipelines::FlowMatchEulerScheduler full(config), cut(config);
  full.set_flux_timesteps(10, 256);
  cut.set_flux_timesteps(10, 256);
  cut.begin_at(4);
  ASSERT_EQ(cut.steps(), 6);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(cut.timesteps()[static_cast<std::size_t>(i)], full.timesteps()[static_cast<std::size_t>(i + 4)]);
    EXPECT_EQ(cut.sigmas()[static_cast<std::size_t>(i)], full.sigmas()[static_cast<std::size_t>(i + 4)]);
  }
  EXPECT_EQ(cut.sigmas().back(), 0.0f);
  EXPECT_EQ(full.sigmas().front(), 1.0f);  // strength 1 starts from the noise alone
  const Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}), n = Tensor::from_vector(std::vector<float>{-1, 0, 5}, {3});
  const std::vector<double> got = values(pipelines::scale_noise(x, n, 0.25f));
  for (int i = 0; i < 3; ++i) {
    const float want = 0.25f * std::vector<float>{-1, 0, 5}[static_cast<std::size_t>(i)] + 0.75f * static_cast<float>(i + 1);
    EXPECT_EQ(got[static_cast<std::size_t>(i)], static_cast<double>(want));
  }
  EXPECT_THROW(cut.begin_at(1), Error);  // once only, before stepping
}

TEST(ImageConditioning, GreyAsPilsConvertL) {
  media::RgbImage image;
  image.width = 4;
  image.height = 1;
  image.pixels = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 200, 30};
  // PIL: L = R 299/1000 + G 587/1000 + B 114/1000, rounded (its integer form in the header).
  const media::RgbImage grey = pipelines::to_grey(image);
  EXPECT_EQ(grey.pixels[0], 76);
  EXPECT_EQ(grey.pixels[3], 150);
  EXPECT_EQ(grey.pixels[6], 29);
  EXPECT_EQ(grey.pixels[9], 124);
  EXPECT_EQ(grey.pixels[10], 124);  // replicated over the three channels
}

TEST(ImageConditioning, TheMaskIsBinarizedAndNearestResized) {
  // A 16 x 16 mask: white (repaint) in the left 6 columns, a grey ramp below the middle.
  media::RgbImage mask;
  mask.width = mask.height = 16;
  mask.pixels.assign(16 * 16 * 3, 0);
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 16; ++x) {
      const uint8_t v = x < 6 ? 255 : (y >= 8 ? static_cast<uint8_t>(16 * x) : 0);
      for (int c = 0; c < 3; ++c) mask.pixels[static_cast<std::size_t>((y * 16 + x) * 3 + c)] = v;
    }
  const Tensor got = pipelines::inpaint_mask(mask, 16, 16, 4, 4);
  ASSERT_EQ(got.shape(), (Shape{1, 1, 4, 4}));
  // The plain rule: the mask as it is (same size: no resampling), 1 where v / 255 >= 0.5, read at
  // (4 y, 4 x).
  const std::vector<double> g = values(got);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) {
      const int v = mask.pixels[static_cast<std::size_t>((4 * y * 16 + 4 * x) * 3)];
      EXPECT_EQ(g[static_cast<std::size_t>(y * 4 + x)], static_cast<float>(v) / 255.0f >= 0.5f ? 1.0 : 0.0) << y << " " << x;
    }
}

}  // namespace image_conditioning_test
}  // namespace cubevec
