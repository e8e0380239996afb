// Suite `pipeline`: the shipped tiny models end to end, as a user runs them, against the same
// pipelines in PyTorch 1.13 in the same run; and the tiny Wan image-to-video model (tests/data/wan_i2v_tiny,
// random weights, no PyTorch row) with its picture's encoding as a stage of its own.
// Suite `pipeline-flux` (not run by default: it writes a 2 GB model once and takes 15 to 25
// minutes on 2 cores): the same rows and best-path search for the FLUX-width model of
// bench/flux_dev_shaped.h (FLUX.1-dev's transformer with 2 + 2 blocks, 3072 wide, random weights,
// embedded guidance 3.5), 512x512, 8 steps, against bench/torch_pipeline.py --flux-width; PyTorch
// in bf16 only where the CPU has bf16 hardware (AMX or AVX512-BF16), else in f32.
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
//
// The best path (issue 41), for tinyflux and tinywan: the fastest combination of the stages that
// keeps the picture (the video's frames) within 30 dB PSNR of the f32 run without stages, on the
// 8-bit pixels as written (PNG), found by a coordinate search over six axes in this order:
//   dtype          f32, bf16
//   quantization   none, W8A8_DYNAMIC (`cubevec quantize` once per model)
//   attention      exact, int8 (--quant-attention int8, where the CPU has AMX-INT8, or AVX512-VNNI with AVX512-BF16)
//   step cache     none; dit-block (every block) from step S computing every I steps, S/I = 4/2, 4/3,
//                  2/2, 3/4 (the `cache` suite's ladder, from the least to the most skipped);
//                  FBCache (db, fn 1, threshold 0.08, warmup 4)
//   sparsity       none, ada_bsa 0.5
// (the threads are the built-in profile's: every core for each unit. An axis of Cube threads was
// dropped when that became the default; it found every core the faster.)
// Each axis tries its options with the earlier axes at their chosen values and the later ones off,
// and keeps the fastest option that stays >= 30 dB (its first run, untimed, writes the PNGs the
// PSNR is taken on; an option below 30 dB is not timed). Row "cubevec best" names the settings,
// its psnr_db and x_torch_best: PyTorch's faster of f32 and bf16 in the same run over it
// (x_torch_best_generate: the same without either side's load stage). With
// random weights (the FLUX-width model) the PSNR is of noise-like pictures: it measures how far the
// settings move the numbers, not how the picture looks.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "bench/flux_dev_shaped.h"
#include "bench/harness.h"
#include "bench/torch_baseline.h"
#include "base/strict_json.h"
#include "media/png.h"
#include "ops/attention.h"
#include "pipelines/quality.h"

namespace cubevec::bench {

namespace {

struct Model {
  std::string name, command, prompt, label;
  std::string folder = "assets/" + name;  // relative to the source tree, or absolute
  std::string extra_args = "";
  std::string quantize_args = command == "t2v" ? "--frames 17" : "";  // `cubevec quantize`'s calibration run
};

std::string folder_of(const Model& m) {
  return std::filesystem::path(m.folder).is_absolute() ? m.folder : std::string(CUBEVEC_SOURCE_DIR) + "/" + m.folder;
}

const std::vector<std::string> kStages = {"load", "text_encoding", "image_encoding", "denoising", "vae_decode", "encode"};

double median_of(std::vector<double> v) { return summarize(std::move(v)).median_s; }

// One `cubevec` run; its --json's stages (the encode stage under its own name: jpeg_encode or
// jpeg_+_avi) and the denoising's FLOPs and step count.
struct CliRun {
  std::map<std::string, double> stages;
  double denoising_flops = 0;
  int steps = 0;
};

// `flags`: "--dtype f32" and any stage flags. `pixels`: write the lossless pictures there instead
// (a PNG, or for t2v the frames as PNGs in that folder beside the AVI).
CliRun run_cli(const Model& m, const std::string& flags, const std::filesystem::path& dir, const std::string& pixels = "") {
  std::string out = (dir / (m.name + (m.command == "t2v" ? ".avi" : ".jpg"))).string();
  std::string frames;
  if (!pixels.empty() && m.command == "t2i") out = pixels;
  if (!pixels.empty() && m.command == "t2v") frames = " --frames-dir '" + pixels + "'";
  const std::string json_path = (dir / "run.json").string();
  const std::string command = std::string("'") + CUBEVEC_BINARY + "' " + m.command + " --model '" + folder_of(m) + "' --prompt '" +
                              m.prompt + "' " + flags + " --seed 0 " + m.extra_args + frames + " --out '" + out + "' --json '" + json_path +
                              "' 2>/dev/null";
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

// Each stage's median over `runs` timed runs of `flags` (after the caller's warm-up).
std::map<std::string, double> median_stages(const Model& m, const std::string& flags, const std::filesystem::path& dir, int runs,
                                            CliRun* first = nullptr) {
  std::vector<CliRun> all;
  for (int i = 0; i < runs; ++i) all.push_back(run_cli(m, flags, dir));
  std::map<std::string, double> stages;
  for (const std::string& s : kStages) {
    std::vector<double> v;
    for (const CliRun& r : all) v.push_back(r.stages.count(s) ? r.stages.at(s) : 0.0);
    stages[s] = median_of(v);
  }
  if (first) *first = all.front();
  return stages;
}

double total_of(const std::map<std::string, double>& stages) {
  double t = 0;
  for (const auto& [name, s] : stages) t += s;
  return t;
}

// The picture (or frames) a run wrote for the quality check.
std::vector<media::RgbImage> read_pixels(const Model& m, const std::string& where) {
  if (m.command == "t2i") return {media::read_png(where)};
  std::vector<media::RgbImage> frames;
  for (int i = 0;; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "frame_%05d.png", i);
    const std::filesystem::path f = std::filesystem::path(where) / name;
    if (!std::filesystem::exists(f)) break;
    frames.push_back(media::read_png(f.string()));
  }
  return frames;
}

struct Option {
  std::string name, flags;
};

// The coordinate search above for model `m`; adds the "cubevec best" row.
void best_path(Context& context, const Model& m, const nlohmann::json& torch, const std::filesystem::path& dir) {
  const std::string model_dir = folder_of(m);
  const std::filesystem::path quant_dir = dir / ("quant-" + m.name);
  const std::string quantize = std::string("'") + CUBEVEC_BINARY + "' quantize --model '" + model_dir + "' --algo W8A8_DYNAMIC --prompt '" +
                               m.prompt + "' " + m.quantize_args + " --out '" + quant_dir.string() + "' >/dev/null 2>&1";
  if (std::system(quantize.c_str()) != 0) throw std::runtime_error("failed: " + quantize);
  const std::string description = (quant_dir / "quant_model_description_w8a8_dynamic.json").string();
  std::vector<std::pair<std::string, std::vector<Option>>> axes = {
      {"dtype", {{"f32", "--dtype f32"}, {"bf16", "--dtype bf16"}}},
      {"quantization", {{"none", ""}, {"W8A8_DYNAMIC", "--quant '" + description + "'"}}},
      {"attention", {{"exact", ""}}},
      {"step cache",
       {{"none", ""},
        {"dit-block 4/2", "--cache dit-block --cache-step-start 4 --cache-interval 2"},
        {"dit-block 4/3", "--cache dit-block --cache-step-start 4 --cache-interval 3"},
        {"dit-block 2/2", "--cache dit-block --cache-step-start 2 --cache-interval 2"},
        {"dit-block 3/4", "--cache dit-block --cache-step-start 3 --cache-interval 4"},
        {"FBCache", "--cache db --cache-fn 1 --cache-threshold 0.08 --cache-warmup 4"}}},
      {"sparsity", {{"none", ""}, {"ada_bsa 0.5", "--sparse ada_bsa --sparsity 0.5"}}},
  };
  if (ops::attention_impl_available(ops::AttentionImpl::flash_int8)) axes[2].second.push_back({"int8", "--quant-attention int8"});
  std::vector<Option> chosen;
  for (const auto& axis : axes) chosen.push_back(axis.second.front());
  const auto flags_of = [&](const std::vector<Option>& settings) {
    std::string f;
    for (const Option& o : settings) f += (f.empty() ? "" : " ") + o.flags;
    return f;
  };
  int candidate = 0;
  // Returns the candidate's PSNR against the reference and, when it is at least 30 dB, its stages
  // and its first timed run (the FLOPs and steps of the row).
  const auto measure = [&](const std::vector<Option>& settings, const std::vector<media::RgbImage>* reference,
                           std::vector<media::RgbImage>* pixels_out, std::map<std::string, double>& stages, CliRun& first) {
    const std::string where = (dir / ("best-" + std::to_string(candidate++) + (m.command == "t2i" ? ".png" : ""))).string();
    if (m.command == "t2v") std::filesystem::create_directories(where);
    run_cli(m, flags_of(settings), dir, where);  // the warm-up writes the pixels
    const std::vector<media::RgbImage> pixels = read_pixels(m, where);
    const double db = reference ? pipelines::compare_pixels(*reference, pixels).psnr_db : INFINITY;
    if (pixels_out) *pixels_out = pixels;
    if (db >= 30.0) stages = median_stages(m, flags_of(settings), dir, context.repeats, &first);
    return db;
  };
  std::vector<media::RgbImage> reference;
  std::map<std::string, double> best_stages;
  CliRun best_first;
  measure(chosen, nullptr, &reference, best_stages, best_first);
  double best_db = INFINITY;
  // int8 attention and block-sparse attention are refused together (the sparse kernel computes in
  // its own precision, docs/stages.md): such a pair is skipped, not run.
  const auto refused_pair = [&](const std::vector<Option>& settings) {
    std::string attention, sparsity;
    for (std::size_t a = 0; a < axes.size(); ++a) {
      if (axes[a].first == "attention") attention = settings[a].name;
      if (axes[a].first == "sparsity") sparsity = settings[a].name;
    }
    return attention == "int8" && sparsity != "none";
  };
  for (std::size_t a = 0; a < axes.size(); ++a) {
    for (std::size_t o = 1; o < axes[a].second.size(); ++o) {
      std::vector<Option> trial = chosen;
      trial[a] = axes[a].second[o];
      if (refused_pair(trial)) {
        std::fprintf(stderr, "  best path %s: %s = %s: not with int8 attention (refused together)\n", m.name.c_str(), axes[a].first.c_str(),
                     trial[a].name.c_str());
        continue;
      }
      std::map<std::string, double> stages;
      CliRun first;
      const double db = measure(trial, &reference, nullptr, stages, first);
      if (db >= 30.0)
        std::fprintf(stderr, "  best path %s: %s = %s: %.1f dB, %.1f ms\n", m.name.c_str(), axes[a].first.c_str(), trial[a].name.c_str(),
                     db, total_of(stages) * 1e3);
      else
        std::fprintf(stderr, "  best path %s: %s = %s: %.1f dB (below 30 dB: not timed)\n", m.name.c_str(), axes[a].first.c_str(),
                     trial[a].name.c_str(), db);
      if (db >= 30.0 && total_of(stages) < total_of(best_stages)) {
        chosen = trial;
        best_stages = stages;
        best_first = first;
        best_db = db;
      }
    }
  }
  std::string settings;
  for (std::size_t a = 0; a < axes.size(); ++a) settings += (a ? ", " : "") + axes[a].first + " " + chosen[a].name;
  Result r = row(m, "cubevec best", settings, best_stages, best_first.steps, best_first.denoising_flops, context);
  r.extra["psnr_db"] = std::isfinite(best_db) ? best_db : 999.0;  // the plain f32 run itself: identical pixels
  if (!torch.is_null()) {
    // Whole runs, and runs without the load (a loaded model generating again, as the library and
    // the server run it; the PyTorch samplers' load is a Python safetensors reader).
    double fastest = 0, fastest_generate = 0;
    for (const nlohmann::json& t : torch.at("results")) {
      if (t.at("model") != m.name) continue;
      double total = 0, generate = 0;
      for (const auto& [key, value] : t.at("stages_s").items()) {
        total += value.get<double>();
        if (key != "load") generate += value.get<double>();
      }
      if (fastest == 0 || total < fastest) fastest = total, fastest_generate = generate;
    }
    if (fastest > 0) {
      r.extra["x_torch_best"] = fastest / r.timing.median_s;
      r.extra["x_torch_best_generate"] = fastest_generate / (r.timing.median_s - best_stages.at("load"));
    }
  }
  context.add(r);
}

// The cubevec and PyTorch rows of `m` in each of `dtypes`.
void plain_rows(Context& context, const Model& m, const nlohmann::json& torch, const std::filesystem::path& dir,
                const std::vector<std::string>& dtypes) {
  for (const std::string& dtype : dtypes) {
    run_cli(m, "--dtype " + dtype, dir);  // warm-up: the page cache and the CPU's clocks
    CliRun first;
    const std::map<std::string, double> stages = median_stages(m, "--dtype " + dtype, dir, context.repeats, &first);
    const double flops = first.denoising_flops;
    const int steps = first.steps;
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
}

std::filesystem::path scratch_dir() {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("cubevec-bench-pipeline-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  return dir;
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
  const std::filesystem::path dir = scratch_dir();
  const nlohmann::json torch = run_torch("torch_pipeline.py", context.machine.threads, context.repeats);
  if (torch.is_null()) std::fprintf(stderr, "note: the PyTorch baseline did not run (needs Debian's python3-torch)\n");
  for (const Model& m : models) plain_rows(context, m, torch, dir, {"f32", "bf16"});
  for (const Model& m : models)
    if (m.name == "tinyflux" || m.name == "tinywan") best_path(context, m, torch, dir);
  std::filesystem::remove_all(dir);
}

void pipeline_flux_suite(Context& context) {
  const std::string folder = flux_width_served_folder();
  const Model m{"flux-width",
                "t2i",
                "a large red circle in the center on a blue background",
                "FLUX-width (3072, 2+2 blocks, random weights) t2i 512x512, 8 steps",
                folder,
                "--width 512 --height 512 --steps 8",
                "--width 512 --height 512 --steps 1 --dtype bf16"};
  const std::filesystem::path dir = scratch_dir();
  // PyTorch's best path as the issue names it: bf16 where the CPU has bf16 hardware, else f32.
  const bool bf16_hardware = context.machine.amx_peak_gflops > 0 || context.machine.bf16_dot_peak_gflops > 0;
  const std::string torch_dtype = bf16_hardware ? "bf16" : "f32";
  const nlohmann::json torch = run_torch("torch_pipeline.py", context.machine.threads, context.repeats,
                                         "--dtypes " + torch_dtype + " --flux-width '" + folder + "'");
  if (torch.is_null()) std::fprintf(stderr, "note: the PyTorch baseline did not run (needs Debian's python3-torch)\n");
  plain_rows(context, m, torch, dir, {torch_dtype});
  best_path(context, m, torch, dir);
  std::filesystem::remove_all(dir);
}

}  // namespace cubevec::bench
