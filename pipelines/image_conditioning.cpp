#include "pipelines/image_conditioning.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <tuple>

#include "base/error.h"
#include "base/strict_json.h"
#include "media/image_input.h"
#include "models/flux_transformer.h"

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

namespace {

// FLUX.1 Kontext's training resolutions (width, height), as diffusers' PREFERRED_KONTEXT_RESOLUTIONS.
constexpr std::pair<int64_t, int64_t> kKontextResolutions[] = {
    {672, 1568}, {688, 1504}, {720, 1456}, {752, 1392}, {800, 1328}, {832, 1248}, {880, 1184}, {944, 1104}, {1024, 1024},
    {1104, 944}, {1184, 880}, {1248, 832}, {1328, 800}, {1392, 752}, {1456, 720}, {1504, 688}, {1568, 672}};

}  // namespace

std::pair<int64_t, int64_t> kontext_output_size(int64_t width, int64_t height, int64_t max_area, int64_t multiple) {
  if (width < 1 || height < 1 || max_area < 1 || multiple < 1)
    throw Error("the Kontext output size needs a positive width, height, --max-area and multiple");
  const double aspect = static_cast<double>(width) / static_cast<double>(height);
  // Python's round(): to nearest, ties to even (std::nearbyint in the default rounding mode).
  const auto w = static_cast<int64_t>(std::nearbyint(std::sqrt(static_cast<double>(max_area) * aspect)));
  const auto h = static_cast<int64_t>(std::nearbyint(std::sqrt(static_cast<double>(max_area) / aspect)));
  const int64_t fw = w / multiple * multiple, fh = h / multiple * multiple;
  constexpr int64_t kMaxSide = 16384;  // the request's own bound on width and height
  if (fw > kMaxSide || fh > kMaxSide)
    throw Error("--max-area " + std::to_string(max_area) + " at the aspect ratio of " + std::to_string(width) + "x" +
                std::to_string(height) + " makes a " + std::to_string(fw) + "x" + std::to_string(fh) + " picture; sides are at most " +
                std::to_string(kMaxSide));
  if (fw < multiple || fh < multiple)
    throw Error("--max-area " + std::to_string(max_area) + " leaves a " + std::to_string(fw) + "x" + std::to_string(fh) +
                " picture at the aspect ratio of " + std::to_string(width) + "x" + std::to_string(height) + " (sides are multiples of " +
                std::to_string(multiple) + "): give a larger area");
  return {fw, fh};
}

std::pair<int64_t, int64_t> kontext_reference_size(int64_t image_width, int64_t image_height, bool auto_resize, int64_t vae_scale_factor,
                                                   int64_t multiple) {
  int64_t w = image_width - image_width % vae_scale_factor, h = image_height - image_height % vae_scale_factor;
  const auto too_small = [&] {
    return Error("--image is " + std::to_string(image_width) + "x" + std::to_string(image_height) +
                 ": a Kontext reference needs at least " + std::to_string(multiple) + " pixels a side");
  };
  if (w < 1 || h < 1) throw too_small();
  if (auto_resize) {
    // min over (|aspect - w/h|, w, h): the nearest aspect ratio, ties to the narrower entry.
    const double aspect = static_cast<double>(w) / static_cast<double>(h);
    std::tuple<double, int64_t, int64_t> best{INFINITY, 0, 0};
    for (const auto& [pw, ph] : kKontextResolutions)
      best = std::min(best,
                      std::tuple<double, int64_t, int64_t>{std::fabs(aspect - static_cast<double>(pw) / static_cast<double>(ph)), pw, ph});
    w = std::get<1>(best);
    h = std::get<2>(best);
  }
  w = w / multiple * multiple;
  h = h / multiple * multiple;
  if (w < 1 || h < 1) throw too_small();
  return {w, h};
}

int64_t kontext_reference_pixel_limit(int64_t width, int64_t height) {
  int64_t largest = 0;
  for (const auto& [w, h] : kKontextResolutions) largest = std::max(largest, w * h);
  return std::max(4 * width * height, largest);
}

Tensor kontext_reference_ids(int64_t latent_height, int64_t latent_width) {
  Tensor ids = models::flux_image_ids(latent_height, latent_width).contiguous();
  Tensor out = Tensor::empty(ids.shape(), DType::f32);
  std::copy(ids.data<float>(), ids.data<float>() + ids.numel(), out.mutable_data<float>());
  for (int64_t i = 0; i < out.size(0); ++i) out.mutable_data<float>()[i * 3] = 1.0f;
  return out;
}

bool names_kontext_pipeline(const std::string& model_dir) {
  const std::string path = model_dir + "/model_index.json";
  std::error_code error;
  const bool present = std::filesystem::exists(path, error);
  if (error) throw Error(path + ": " + error.message());  // a link loop, a folder that cannot be searched
  if (!present) return false;
  const nlohmann::json index = read_json_file(path);
  if (!index.is_object()) throw Error(path + ": expected a JSON object (diffusers' model_index.json)");
  const auto it = index.find("_class_name");
  if (it == index.end()) return false;
  if (!it->is_string()) throw Error(path + ": '_class_name' must be a string, got " + it->dump());
  return it->get<std::string>() == "FluxKontextPipeline";
}

}  // namespace cubevec::pipelines
