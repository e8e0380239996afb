// Suite `api`: what loading once buys. For the shipped tiny models (the README's prompts at the
// models' defaults: tinyflux 64x64 / 28 steps, tinywan 64x64 x 17 frames / 30 steps / CFG fused):
//   - library: Pipeline::load once (its time is the load_ms figure), then one warm-up request and
//     --repeats timed ones, each generate() from the prompt to RGB pixels;
//   - process: the same request through `cubevec t2i` / `t2v` as a new process each time (one
//     warm-up, then --repeats), which pays start-up, load, GEMM packing and tuning every time,
//     and also writes its JPEG / AVI;
// x_library = the process's median over the library's. GFLOP/s are the denoising's declared FLOPs
// over the request's median wall time, as a fraction of the f32 FMA peak measured in this run.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench/harness.h"
#include "pipelines/pipeline.h"

namespace cubevec::bench {

namespace {

struct ApiModel {
  std::string name, command, prompt, label, out;
};

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void api_suite(Context& context) {
  const std::vector<ApiModel> models = {
      {"tinyflux", "t2i", "a large red circle in the center on a blue background", "tinyflux 64x64 28 steps", "out.jpg"},
      {"tinywan", "t2v", "a red circle moving right on a blue background", "tinywan 64x64x17 30 steps cfg", "out.avi"}};
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("cubevec_bench_api_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const ApiModel& m : models) {
    const std::string folder = std::string(CUBEVEC_SOURCE_DIR) + "/assets/" + m.name;
    std::unique_ptr<pipelines::Pipeline> pipeline;
    const double load_s = seconds_of([&] { pipeline = pipelines::Pipeline::load(folder); });
    pipelines::Request request;
    request.text.prompt = m.prompt;
    double flops = 0;
    pipeline->generate(request);  // warm-up: packing, tuning, the page cache
    std::vector<double> library;
    for (int i = 0; i < context.repeats; ++i) library.push_back(seconds_of([&] { flops = pipeline->generate(request).denoising_flops; }));

    const std::string command = std::string("'") + CUBEVEC_BINARY + "' " + m.command + " --model '" + folder + "' --prompt '" + m.prompt +
                                "' --out '" + (dir / m.out).string() + "' 2>/dev/null";
    const auto run_process = [&] {
      if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
    };
    run_process();  // warm-up
    std::vector<double> process;
    for (int i = 0; i < context.repeats; ++i) process.push_back(seconds_of(run_process));

    Result lib{"api", m.label, "library generate()"};
    lib.timing = summarize(library);
    lib.gflops = flops / lib.timing.median_s / 1e9;
    lib.peak_fraction = lib.gflops / context.machine.fma_peak_gflops;
    lib.extra["load_ms"] = load_s * 1e3;
    Result proc{"api", m.label, "cubevec " + m.command + " process"};
    proc.timing = summarize(process);
    proc.gflops = flops / proc.timing.median_s / 1e9;
    proc.peak_fraction = proc.gflops / context.machine.fma_peak_gflops;
    proc.extra["x_library"] = proc.timing.median_s / lib.timing.median_s;
    context.add(lib);
    context.add(proc);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace cubevec::bench
