// Suite `images`: what pictures in cost.
//   encode / decode   the FLUX.1 VAE's encoder and decoder at their real widths (random weights) on a
//                     512 x 512 picture: seconds, GFLOP/s of the kernels' declared FLOPs and the
//                     fraction of the FMA peak, and the encoder's time over the decoder's
//   img2img / t2i     the shipped tinyflux end to end at 64 x 64, 28 steps: text-to-image against
//                     image-to-image at strength 0.6 (17 steps, plus the encode) and inpainting; the
//                     ratio of their times is what strength saves
//   LoRA              one FLUX.1 double block (3072 wide, 1024 image + 256 text tokens, bf16 weights
//                     and activations) plain (what a fused LoRA costs: nothing) against the same
//                     block with a rank-16 LoRA on every Linear at run time (models/lora_runtime.h),
//                     alternating rounds; the overhead's target is < 5% of the block's time
#include <chrono>
#include <cstdio>

#include "bench/block_inputs.h"
#include "bench/harness.h"
#include "device/device.h"
#include "media/png.h"
#include "models/autoencoder_kl_encoder.h"
#include "models/flux_transformer.h"
#include "models/lora_runtime.h"
#include "ops/vector_ops.h"
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

// A FLUX.1 double block with and without a rank-16 runtime LoRA on each of its Linears.
void lora_rows(Context& context, Device& device) {
  const Stream s = device.default_stream();
  const models::FluxConfig config = models::FluxConfig::flux1_dev();
  const int64_t rank = 16;
  models::ParameterTable table;
  models::FluxDoubleBlock block;
  block.declare(table, 0, config);
  models::make_random_parameters(table, DType::bf16, 5, 0.02f);
  const FluxBlockInputsF32 in = flux_block_inputs(config, s);  // 1024 image + 256 text tokens, as `blocks`
  const models::ForwardContext ctx{.activations = DType::bf16};
  const models::FluxBlockInputs shared{ops::cast(in.silu_temb, DType::bf16, s), in.rope, {1, 32, 32}};
  const models::BlockState state{ops::cast(in.hidden, DType::bf16, s), ops::cast(in.context_states, DType::bf16, s)};
  // Every Linear of the block gets A [16, in] and B [out, 16] (scale 1, alpha = rank).
  models::ParameterTable lora_table;
  std::vector<std::pair<models::Linear*, std::pair<Tensor, Tensor>>> parts;
  for (const auto& [name, layer] : table.linears()) parts.push_back({layer, {}});
  for (std::size_t i = 0; i < parts.size(); ++i) {
    lora_table.add("a" + std::to_string(i), {rank, parts[i].first->in}, &parts[i].second.first);
    lora_table.add("b" + std::to_string(i), {parts[i].first->out, rank}, &parts[i].second.second);
  }
  models::make_random_parameters(lora_table, DType::f32, 31, 0.02f);
  std::vector<models::LoraDelta> deltas;
  for (const auto& [layer, ab] : parts) deltas.push_back({layer->name, layer, ab.first, ab.second, {}, 1.0, 0.0});
  models::RuntimeLora lora;
  lora.add(deltas);
  const auto forward = [&] { block.forward(state, shared, ctx, s).hidden.data_ptr(); };
  forward();
  std::vector<double> plain_s, lora_s;
  const int rounds = std::max(3, context.repeats / 2);
  for (int i = 0; i < rounds; ++i) {
    plain_s.push_back(time_runs(forward, 1, 0).median_s);
    const models::RuntimeLoraScope scope(&lora);
    lora_s.push_back(time_runs(forward, 1, 0).median_s);
  }
  const Timing plain = summarize(plain_s), with_lora = summarize(lora_s);
  const std::string label = "FLUX.1 double block 1024+256, bf16, LoRA on " + std::to_string(parts.size()) + " Linears";
  Result fused{"images", label, "fused (= plain)"};
  fused.dtype = "bf16";
  fused.timing = plain;
  context.add(fused);
  Result runtime{"images", label, "runtime rank 16"};
  runtime.dtype = "bf16";
  runtime.timing = with_lora;
  runtime.extra["overhead"] = with_lora.median_s / plain.median_s - 1.0;
  runtime.extra["lora_gflop"] = 2.0 * lora.macs_per_row() * static_cast<double>(kFluxImageTokens + kFluxTextTokens) / 1e9;
  context.add(runtime);
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
  lora_rows(context, device);

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
