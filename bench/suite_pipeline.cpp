// Suite `pipeline`: the shipped tiny models end to end, as a user runs them, against the same
// pipelines in PyTorch 1.13 in the same run; and the tiny Wan image-to-video model (tests/data/wan_i2v_tiny,
// random weights, no PyTorch row) with its picture's encoding as a stage of its own.
//   - cubevec: the built `cubevec t2i --model assets/tinyflux` (the README's prompt, 64x64, 28 steps,
//     CFG off) and `cubevec t2v --model assets/tinywan` (the README's video prompt at the model's
//     defaults: 64x64 x 17 frames, 30 steps, CFG 5 fused), each with --dtype f32 and bf16, one
//     warm-up run then --repeats runs, each stage's median from the run's --json: load, text
//     encoding, denoising (and per step), VAE decode, encode (JPEG; for t2v JPEG + AVI);
//   - PyTorch: bench/torch_pipeline.py, the PyTorch samplers of tools/tinyflux and tools/tinywan
//     (step for step the same pipelines), the same stages, f32 and bf16 (every module's weights in
//     bf16, as a diffusers torch_dtype=torch.bfloat16 run).
// Each row's median is the sum of the stages' medians; GFLOP/s are the denoising's (the kernels'
// declared FLOPs, the same count for both) over its median, the fraction is of the measured f32
// FMA peak; x_torch = PyTorch's time over cubevec's for the whole pipeline and per step.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "bench/harness.h"
#include "bench/torch_baseline.h"
#include "base/strict_json.h"

namespace cubevec::bench {

namespace {

struct Model {
  std::string name, command, prompt, label;
  std::string folder = "assets/" + name;  // relative to the source tree
  std::string extra_args = "";
};

const std::vector<std::string> kStages = {"load", "text_encoding", "image_encoding", "denoising", "vae_decode", "encode"};

double median_of(std::vector<double> v) { return summarize(std::move(v)).median_s; }

// One `cubevec` run; its --json's stages (the encode stage under its own name: jpeg_encode or
// jpeg_+_avi) and the denoising's FLOPs and step count.
struct CliRun {
  std::map<std::string, double> stages;
  double denoising_flops = 0;
  int steps = 0;
};

CliRun run_cli(const Model& m, const std::string& dtype, const std::filesystem::path& dir) {
  const std::string out = (dir / (m.name + (m.command == "t2v" ? ".avi" : ".jpg"))).string();
  const std::string json_path = (dir / "run.json").string();
  const std::string command = std::string("'") + CUBEVEC_BINARY + "' " + m.command + " --model '" + CUBEVEC_SOURCE_DIR + "/" + m.folder +
                              "' --prompt '" + m.prompt + "' --dtype " + dtype + " --seed 0 " + m.extra_args + " --out '" + out +
                              "' --json '" + json_path + "' 2>/dev/null";
  if (std::system(command.c_str()) != 0) throw std::runtime_error("failed: " + command);
  const nlohmann::json j = read_json_file(json_path);
  CliRun r;
  for (const auto& [key, value] : j.at("stages_s").items()) {
    const bool known = key == "load" || key == "text_encoding" || key == "image_encoding" || key == "denoising" || key == "vae_decode";
    r.stages[known ? key : "encode"] += value.get<double>();
  }
  r.denoising_flops = j.at("denoising_flops").get<double>();
  r.steps = j.at("steps").get<int>();
  return r;
}

Result row(const Model& m, const std::string& impl, const std::string& dtype, const std::map<std::string, double>& stages, int steps,
           double flops, const Context& context) {
  Result r{"pipeline", m.label, impl};
  r.dtype = dtype;
  double total = 0;
  for (const std::string& s : kStages) {
    const double v = stages.count(s) ? stages.at(s) : 0.0;
    total += v;
    r.extra[s + "_ms"] = v * 1e3;
  }
  r.extra["step_ms"] = stages.at("denoising") / steps * 1e3;
  r.timing = {total, total, total, context.repeats};
  r.gflops = flops / stages.at("denoising") / 1e9;
  r.peak_fraction = r.gflops / context.machine.fma_peak_gflops;
  return r;
}

}  // namespace

void pipeline_suite(Context& context) {
  const std::vector<Model> models = {
      {"tinyflux", "t2i", "a large red circle in the center on a blue background", "tinyflux t2i 64x64, 28 steps"},
      {"tinywan", "t2v", "a red circle moving right on a blue background", "tinywan t2v 64x64x17, 30 steps, CFG"},
      // The tiny image-to-video model (random weights; no PyTorch sampler): the picture's encoding
      // (CLIP and the Wan VAE encoder) beside the loop.
      {"wan_i2v_tiny", "t2v", "a red circle moving right", "tiny Wan I2V 48x32x9, 10 steps, CFG", "tests/data/wan_i2v_tiny",
       "--image '" + std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/images/rgb.png' --width 48 --height 32 --frames 9 --steps 10"},
  };
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("cubevec-bench-pipeline-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const nlohmann::json torch = run_torch("torch_pipeline.py", context.machine.threads, context.repeats);
  if (torch.is_null()) std::fprintf(stderr, "note: the PyTorch baseline did not run (needs Debian's python3-torch)\n");
  for (const Model& m : models)
    for (const std::string dtype : {"f32", "bf16"}) {
      run_cli(m, dtype, dir);  // warm-up: the page cache and the CPU's clocks
      std::vector<CliRun> runs;
      for (int i = 0; i < context.repeats; ++i) runs.push_back(run_cli(m, dtype, dir));
      std::map<std::string, double> stages;
      for (const std::string& s : kStages) {
        std::vector<double> v;
        for (const CliRun& r : runs) v.push_back(r.stages.count(s) ? r.stages.at(s) : 0.0);
        stages[s] = median_of(v);
      }
      const double flops = runs.front().denoising_flops;
      const int steps = runs.front().steps;
      Result ours = row(m, "cubevec", dtype, stages, steps, flops, context);
      if (!torch.is_null())
        for (const nlohmann::json& t : torch.at("results")) {
          if (t.at("model") != m.name || t.at("dtype") != dtype) continue;
          std::map<std::string, double> theirs;
          for (const auto& [key, value] : t.at("stages_s").items()) theirs[key] = value.get<double>();
          Result base = row(m, "pytorch 1.13", dtype, theirs, steps, flops, context);
          ours.extra["x_torch"] = base.timing.median_s / ours.timing.median_s;
          ours.extra["x_torch_step"] = base.extra["step_ms"] / ours.extra["step_ms"];
          context.add(base);
        }
      context.add(ours);
    }
  std::filesystem::remove_all(dir);
}

}  // namespace cubevec::bench
