// Suite `vae`: the Wan2.1 VAE decoder at its real widths (base 96, random weights) on a small video,
// 208 x 120 from 3 latent frames (9 video frames), decoded frame by frame as `cubevec t2v` does:
// seconds per chunk (the first latent frame gives 1 video frame, later ones 4), GFLOP/s of the
// kernels' declared FLOPs over the 4-frame chunks, and the allocator's peak against the decoder's
// own estimate. At 832 x 480 every figure scales with the pixel count (the mid-block attention at
// latent resolution aside).
// Then single 3x3 convolutions (padding 1) at the channel counts and sizes of the narrow VAEs
// (tinyflux, tinywan, the FLUX-width model's decoder at 512x512) and two wider ones: cubevec's conv2d
// as it runs (the direct kernel for <= 64 output channels on AVX-512) and forced to im2col + GEMM,
// against PyTorch 1.13's nn.Conv2d in f32 and bf16 (bench/torch_conv.py) in the same run.
#include <chrono>
#include <cstdio>

#include "bench/harness.h"
#include "bench/torch_baseline.h"
#include "device/device.h"
#include "models/autoencoder_kl_wan.h"
#include "models/parameters.h"
#include "ops/conv.h"
#include "tensor/caching_allocator.h"

namespace cubevec::bench {

namespace {

struct ConvShape {
  int64_t c, o, h, w;
};
// Keep in step with bench/torch_conv.py's SHAPES.
const ConvShape kConvShapes[] = {{32, 32, 128, 128}, {16, 16, 512, 512}, {32, 16, 512, 512},
                                 {16, 3, 512, 512},  {64, 64, 128, 128}, {128, 128, 64, 64}};

void conv_rows(Context& context, Device& device) {
  const nlohmann::json torch = run_torch("torch_conv.py", context.machine.threads, context.repeats);
  if (torch.is_null()) std::fprintf(stderr, "note: the PyTorch convolution baseline did not run (needs Debian's python3-torch)\n");
  const Stream s = device.default_stream();
  for (const ConvShape& shape : kConvShapes) {
    models::ParameterTable table;
    Tensor x, w, b;
    table.add("x", {1, shape.c, shape.h, shape.w}, &x);
    table.add("w", {shape.o, shape.c, 3, 3}, &w);
    table.add("b", {shape.o}, &b);
    models::make_random_parameters(table, DType::f32, 7, 0.1f);
    const double flops = 2.0 * static_cast<double>(shape.o * shape.c * 9 * shape.h * shape.w);
    const std::string label = "conv2d 3x3 " + std::to_string(shape.c) + "->" + std::to_string(shape.o) + " " + std::to_string(shape.h) +
                              "x" + std::to_string(shape.w);
    double as_runs = 0;
    for (const bool direct : {true, false}) {
      ops::Conv2dOptions options;
      options.padding = {1, 1};
      options.direct = direct;
      const Timing t = time_runs([&] { ops::conv2d(x, w, b, options, s).data_ptr(); }, context.repeats);
      Result r{"vae", label, direct ? "cubevec" : "cubevec im2col+gemm"};
      r.timing = t;
      r.gflops = flops / t.median_s / 1e9;
      r.peak_fraction = r.gflops / context.machine.fma_peak_gflops;
      if (direct) as_runs = t.median_s;
      else r.extra["x_as_run"] = t.median_s / as_runs;  // the default path's speedup over im2col + GEMM
      if (!torch.is_null())
        for (const nlohmann::json& row : torch.at("results"))
          if (row.at("c") == shape.c && row.at("o") == shape.o && row.at("h") == shape.h && row.at("w") == shape.w)
            r.extra["x_torch_" + row.at("dtype").get<std::string>()] = row.at("median_s").get<double>() / t.median_s;
      context.add(r);
    }
  }
}

}  // namespace

void vae_suite(Context& context) {
  constexpr int64_t kLatentH = 15, kLatentW = 26, kLatentFrames = 3;
  DeviceProfile profile = builtin_cpu_profile();
  profile.cube_threads = context.machine.threads;
  profile.vector_threads = context.machine.threads;
  Device device(profile, {.trace = true});
  const Stream s = device.default_stream();
  models::AutoencoderKLWan vae(models::AutoencoderKLWanConfig::wan21());
  models::make_random_parameters(vae.parameters(), DType::f32, 15, 0.02f);
  models::ParameterTable inputs;
  Tensor z;
  inputs.add("z", {1, 16, kLatentFrames, kLatentH, kLatentW}, &z);
  models::make_random_parameters(inputs, DType::f32, 41, 1.0f);

  CachingAllocator& alloc = default_allocator();
  std::vector<double> chunk_s;  // the 4-frame chunks, every run
  double first_s = 0, flops = 0;
  std::size_t peak = 0;
  const int runs = std::max(1, context.repeats / 3);
  for (int run = 0; run < runs; ++run) {
    device.synchronize();
    device.trace().clear();
    alloc.reset_peak_stats();
    const std::size_t before = alloc.stats().live_bytes;
    auto last = std::chrono::steady_clock::now();
    int chunk = 0;
    vae.decode_frames(
        z,
        [&](const Tensor& frames) {
          frames.data_ptr();  // waits for the chunk
          const auto now = std::chrono::steady_clock::now();
          const double seconds = std::chrono::duration<double>(now - last).count();
          if (chunk++ == 0) first_s = seconds;
          else chunk_s.push_back(seconds);
          last = now;
        },
        {}, s);
    device.synchronize();
    peak = std::max(peak, alloc.stats().peak_live_bytes - before);
    flops = 0;
    for (const auto& r : device.trace().records()) flops += r.desc.flops;
  }
  const double chunk_flops = flops / static_cast<double>(kLatentFrames);  // about even: the first chunk is 1/4 of the pixels
  Result r{"vae", "wan2.1 decode 208x120, 4-frame chunk", "cubevec"};
  r.timing = summarize(chunk_s);
  r.gflops = chunk_flops / r.timing.median_s / 1e9;
  r.peak_fraction = r.gflops / context.machine.fma_peak_gflops;
  r.extra["first_chunk_s"] = first_s;
  r.extra["peak_mb"] = static_cast<double>(peak) / 1e6;
  r.extra["estimate_mb"] = static_cast<double>(vae.estimate_peak_bytes(1, kLatentH, kLatentW)) / 1e6;
  r.extra["caches_mb"] = static_cast<double>(vae.feature_cache_bytes(1, kLatentH, kLatentW)) / 1e6;
  context.add(r);
  conv_rows(context, device);
}

}  // namespace cubevec::bench
