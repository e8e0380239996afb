#include "pipelines/image_conditioning.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "base/error.h"
#include "media/image_input.h"

namespace cubevec::pipelines {

int img2img_start_step(int steps, double strength) {
  if (!(strength > 0.0 && strength <= 1.0))
    throw Error("--strength must be in (0, 1], got " + number_for_message(strength) +
                (strength == 0.0 ? " (0 would run no denoising step: the picture would come back as it went in)" : ""));
  const double init = std::min(static_cast<double>(steps) * strength, static_cast<double>(steps));
  const int start = static_cast<int>(std::max(static_cast<double>(steps) - init, 0.0));
  if (steps - start < 1)
    throw Error("--strength " + number_for_message(strength) + " leaves no denoising step of " + std::to_string(steps) +
                " (raise --steps)");
  return start;
}

Tensor scale_noise(const Tensor& latents, const Tensor& noise, float sigma) {
  if (latents.shape() != noise.shape() || latents.dtype() != DType::f32 || noise.dtype() != DType::f32)
    throw Error("scale_noise: latents and noise must be f32 of one shape, got " + latents.describe() + " and " + noise.describe());
  const Tensor l = latents.contiguous(), n = noise.contiguous();
  Tensor out = Tensor::empty(latents.shape(), DType::f32);
  const float *pl = l.data<float>(), *pn = n.data<float>();
  float* po = out.mutable_data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) po[i] = sigma * pn[i] + (1.0f - sigma) * pl[i];
  return out;
}

uint64_t encode_sample_seed(uint64_t seed) { return seed ^ 0x9E3779B97F4A7C15ULL; }

media::RgbImage to_grey(const media::RgbImage& image) {
  media::RgbImage out = image;
  for (std::size_t i = 0; i + 2 < out.pixels.size(); i += 3) {
    const uint32_t l = (19595u * image.pixels[i] + 38470u * image.pixels[i + 1] + 7471u * image.pixels[i + 2] + 0x8000u) >> 16;
    out.pixels[i] = out.pixels[i + 1] = out.pixels[i + 2] = static_cast<uint8_t>(l);
  }
  return out;
}

Tensor inpaint_mask(const media::RgbImage& mask, int64_t width, int64_t height, int64_t latent_h, int64_t latent_w) {
  const media::RgbImage resized = media::resize_lanczos(to_grey(mask), static_cast<int>(width), static_cast<int>(height));
  Tensor out = Tensor::empty({1, 1, latent_h, latent_w}, DType::f32);
  float* p = out.mutable_data<float>();
  // torch.nn.functional.interpolate(mode="nearest"): source index floor(dst * in / out).
  const float sy = static_cast<float>(height) / static_cast<float>(latent_h), sx = static_cast<float>(width) / static_cast<float>(latent_w);
  for (int64_t y = 0; y < latent_h; ++y)
    for (int64_t x = 0; x < latent_w; ++x) {
      const int64_t iy = std::min(static_cast<int64_t>(std::floor(static_cast<float>(y) * sy)), height - 1);
      const int64_t ix = std::min(static_cast<int64_t>(std::floor(static_cast<float>(x) * sx)), width - 1);
      const float v = static_cast<float>(resized.pixels[static_cast<std::size_t>((iy * width + ix) * 3)]) / 255.0f;
      p[y * latent_w + x] = v >= 0.5f ? 1.0f : 0.0f;
    }
  return out;
}

}  // namespace cubevec::pipelines
