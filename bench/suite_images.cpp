// Suite `images`: what pictures in cost.
//   encode / decode   the FLUX.1 VAE's encoder and decoder at their real widths (random weights) on a
//                     512 x 512 picture: seconds, GFLOP/s of the kernels' declared FLOPs and the
//                     fraction of the FMA peak, and the encoder's time over the decoder's
//   img2img / t2i     the shipped tinyflux end to end at 64 x 64, 28 steps: text-to-image against
//                     image-to-image at strength 0.6 (17 steps, plus the encode) and inpainting; the
//                     ratio of their times is what strength saves
#include <chrono>
#include <cstdio>

#include "bench/harness.h"
#include "device/device.h"
#include "media/png.h"
#include "models/autoencoder_kl_encoder.h"
#include "models/parameters.h"
#include "pipelines/pipeline.h"

namespace cubevec::bench {

namespace {

// Seconds and declared FLOPs of `body` on `device` (median over runs after one warm-up).
std::pair<Timing, double> timed_with_flops(Device& device, int runs, const std::function<Tensor()>& body) {
  double flops = 0;
  const Timing t = time_runs(
      [&] {
        device.trace().clear();
        Tensor out = body();
        out.data_ptr();
        device.synchronize();
        flops = 0;
        for (const auto& r : device.trace().records()) flops += r.desc.flops;
      },
      runs, 1);
  return {t, flops};
}

}  // namespace

void images_suite(Context& context) {
  DeviceProfile profile = builtin_cpu_profile();
  profile.cube_threads = context.machine.threads;
  profile.vector_threads = context.machine.threads;
  Device device(profile, {.trace = true});
  const Stream s = device.default_stream();
  const models::AutoencoderKLConfig config = models::AutoencoderKLConfig::flux();
  models::AutoencoderKLEncoder encoder(config);
  models::AutoencoderKLDecoder decoder(config);
  models::make_random_parameters(encoder.parameters(), DType::f32, 21, 0.02f);
  models::make_random_parameters(decoder.parameters(), DType::f32, 22, 0.02f);
  models::ParameterTable inputs;
  Tensor picture, latent;
  inputs.add("picture", {1, 3, 512, 512}, &picture);
  inputs.add("latent", {1, 16, 64, 64}, &latent);
  models::make_random_parameters(inputs, DType::f32, 23, 1.0f);
  const int runs = std::max(2, context.repeats / 2);
  const auto [encode_t, encode_flops] = timed_with_flops(device, runs, [&] { return encoder.moments(picture, s); });
  const auto [decode_t, decode_flops] = timed_with_flops(device, runs, [&] { return decoder.decode(latent, s); });
  for (const auto& [name, t, flops] :
       {std::tuple{"encode 512x512", encode_t, encode_flops}, std::tuple{"decode 512x512", decode_t, decode_flops}}) {
    Result r{"images", std::string("FLUX.1 VAE ") + name, "cubevec"};
    r.timing = t;
    r.gflops = flops / t.median_s / 1e9;
    r.peak_fraction = r.gflops / context.machine.fma_peak_gflops;
    if (std::string(name).rfind("encode", 0) == 0) r.extra["x_decode_time"] = t.median_s / decode_t.median_s;
    context.add(r);
  }

  // tinyflux end to end: the same prompt and seed as text-to-image, image-to-image and inpainting.
  const auto pipeline = pipelines::Pipeline::load(std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux");
  const std::string request =
      R"({"prompt": "a large yellow square in the center on a blue background", "width": 64, "height": 64, "num_inference_steps": 28, "seed": 2)";
  const media::RgbImage source =
      pipeline->generate(pipelines::Request::parse(R"({"prompt": "a large red circle in the center on a blue background", "seed": 1})"))
          .images.at(0);
  media::RgbImage mask = source;
  for (int y = 0; y < mask.height; ++y)
    for (int x = 0; x < mask.width; ++x)
      for (int c = 0; c < 3; ++c) mask.pixels[static_cast<std::size_t>((y * mask.width + x) * 3 + c)] = x < mask.width / 2 ? 255 : 0;
  double t2i_s = 0;
  for (const auto& [impl, strength, masked] :
       {std::tuple{"t2i", 0.0, false}, std::tuple{"img2img 0.6", 0.6, false}, std::tuple{"inpaint 1.0", 1.0, true}}) {
    pipelines::Request r = pipelines::Request::parse(request + "}");
    if (strength > 0) {
      r.strength = strength;
      r.image_pixels = std::make_shared<const media::RgbImage>(source);
      if (masked) r.mask_pixels = std::make_shared<const media::RgbImage>(mask);
    }
    const Timing t = time_runs([&] { pipeline->generate(r); }, std::max(3, context.repeats), 1);
    Result row{"images", "tinyflux 64x64, 28 steps", impl};
    row.timing = t;
    if (strength == 0) t2i_s = t.median_s;
    else row.extra["x_t2i_time"] = t.median_s / t2i_s;
    context.add(row);
  }
}

}  // namespace cubevec::bench
