// `cubevec quantize`: exports MindIE SD quantization files from a float Flux or Wan model folder.
// Calibration runs the float model over the given prompts (or prompt embeddings) and steps with
// every Linear's input range recorded (pipelines/quant_export.h), then writes
// quant_model_description_{algo}.json and quant_model_weight_{algo}.safetensors into --out, and
// reports each layer's cosine against float on its calibration rows, worst first. A two-expert
// folder (Wan2.2 A14B) gets one pair per expert, each calibrated on the steps it runs:
// transformer/'s in --out, transformer_2/'s in --out/transformer_2 (t2v takes them as --quant and
// --quant-2).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/output_flag.h"
#include "cli/command.h"
#include "cli/device_flags.h"
#include "cli/fixed_shape_run.h"
#include "cli/range_flag.h"
#include "pipelines/quant_export.h"
#include "pipelines/prompt_embeds_file.h"
#include "base/error.h"
#include "base/output_file.h"
#include "base/json_text.h"

namespace cubevec::cli {

namespace {

struct QuantizeFlags {
  std::string model, algo, out, json_path, dtype = "f32", variant;
  std::vector<std::string> prompts, embeds, exclude;
  int steps = 28, top = 15;
  int64_t width = 0, height = 0, frames = 5;
  uint64_t seed = 0;
  bool deq_int64 = false;
};

// The output folder exists and takes files, and the report does not land on an output file: all
// checked before calibration, so a bad path does not cost the run.
void check_outputs(const QuantizeFlags& f, const std::string& dir, quant::Algorithm algorithm) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // The second expert's folder is cubevec's to make inside --out: a link there would send its
  // files anywhere (over another model's).
  if (dir != f.out && fs::is_symlink(fs::symlink_status(dir, ec)))
    throw Error("--out " + f.out + ": " + dir + " is a symbolic link; the second expert's files go into a real folder there");
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) throw Error("--out " + dir + ": cannot create the output folder" + (ec ? " (" + ec.message() + ")" : ""));
  // --json itself was checked while parsing (cli/output_flag.h); here: the pair, and the report
  // not landing on it.
  const std::string algo(quant::algorithm_name(algorithm));
  for (const std::string& file : {quant::description_file(dir, algo), quant::weight_file(dir, algo)}) {
    check_output_path(file, "--out");
    if (!f.json_path.empty() && fs::weakly_canonical(f.json_path) == fs::weakly_canonical(file))
      throw Error("--json " + f.json_path + ": is one of the quantization files this run writes; give the report another name");
  }
}

// One expert's export and its report lines; the JSON part of the report.
nlohmann::ordered_json export_one(models::ParameterTable& table, const pipelines::CalibrationStage& calibration,
                                  const pipelines::QuantExportOptions& options, const QuantizeFlags& f, const std::string& dir,
                                  const std::string& what) {
  const pipelines::QuantExportResult result = pipelines::export_quantized(table, calibration, options, f.steps, dir);
  std::fprintf(stderr, "\n%sper-layer cosine of the quantized output against float on calibration rows (worst first):\n", what.c_str());
  for (std::size_t i = 0; i < result.layers.size() && i < static_cast<std::size_t>(f.top); ++i)
    std::fprintf(stderr, "  %-56s %.6f\n", result.layers[i].module.c_str(), result.layers[i].cosine);
  if (!result.layers.empty())
    std::fprintf(stderr, "  ... %zu layers, worst %.6f, best %.6f\n", result.layers.size(), result.layers.front().cosine,
                 result.layers.back().cosine);
  std::fprintf(stderr, "wrote %s and %s (int8 layers %.2f MiB, float %.2f MiB)\n", result.description_path.c_str(),
               result.weight_path.c_str(), static_cast<double>(result.int8_bytes) / (1 << 20),
               static_cast<double>(result.float_bytes) / (1 << 20));
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const auto& l : result.layers) layers.push_back({{"module", l.module}, {"cosine", l.cosine}});
  return {{"description", result.description_path}, {"weights", result.weight_path}, {"excluded", result.excluded}, {"layers", layers}};
}

int run(const QuantizeFlags& f, const DeviceFlags& device_flags) {
  if (f.model.empty()) throw Error("--model DIR is required (a diffusers Flux or Wan folder with float weights)");
  if (f.out.empty()) throw Error("--out DIR is required (the folder for the quant description and weight files)");
  if (f.algo.empty()) throw Error("--algo is required: W8A16, W8A8_DYNAMIC, W8A8 or W8A8_TIMESTEP");
  const std::optional<quant::Algorithm> algorithm = quant::parse_algorithm(f.algo, "--algo");
  if (!algorithm)
    throw Error("--algo " + f.algo + ": MindIE SD has that algorithm, but cubevec exports W8A16, W8A8_DYNAMIC, W8A8, W8A8_TIMESTEP");
  if (f.prompts.empty() && f.embeds.empty())
    throw Error("calibration needs data: give --prompt TEXT (one or more) or --calibration-embeds FILE (one or more)");
  const DType dtype = parse_dtype(f.dtype);
  if (dtype != DType::f32 && dtype != DType::bf16) throw Error("--dtype must be f32 or bf16, got " + f.dtype);
  check_outputs(f, f.out, *algorithm);
  Device device(device_flags.resolve());
  FixedShapeRun model(f.model, dtype, f.variant, {f.steps, f.width, f.height, f.frames, f.seed}, device);

  // The calibration data: each prompt through the model's text encoder, each embeddings file as is.
  std::vector<std::pair<std::string, models::PromptEmbeddings>> data;
  for (const std::string& prompt : f.prompts) {
    pipelines::PromptRequest text;
    text.prompt = prompt;
    data.push_back({"prompt \"" + prompt + "\"", model.text(text).positive});
  }
  for (const std::string& file : f.embeds) data.push_back({file, pipelines::PromptEmbedsFile::load(file, !model.video()).positive});

  pipelines::QuantExportOptions options;
  options.algorithm = *algorithm;
  options.exclude = f.exclude;
  options.deq_scale_int64 = f.deq_int64;
  pipelines::StageList stages;
  auto calibration_owner = std::make_unique<pipelines::CalibrationStage>(options);
  pipelines::CalibrationStage& calibration = *calibration_owner;
  stages.add(std::move(calibration_owner));
  stages.after_load(model.model().transformer_parameters());
  // Two experts: the low-noise one observed by a calibration of its own, on the steps it runs.
  models::ParameterTable* second = model.model().mutable_second_expert_parameters();
  pipelines::CalibrationStage* calibration_2 = nullptr;
  const std::string out_2 = f.out + "/transformer_2";
  if (second) {
    check_outputs(f, out_2, *algorithm);
    auto owner = std::make_unique<pipelines::CalibrationStage>(options);
    calibration_2 = owner.get();
    calibration_2->after_load(*second);
    stages.add(std::move(owner));
  }
  if (calibration.stats().empty())
    throw Error("--exclude leaves no Linear to quantize (all " + std::to_string(calibration.excluded().size()) + " match)");
  for (const std::string& pattern : f.exclude) {
    const auto& excluded = calibration.excluded();
    if (std::none_of(excluded.begin(), excluded.end(), [&](const std::string& name) { return pipelines::glob_match(pattern, name); }))
      std::fprintf(stderr, "quantize: warning: --exclude '%s' matches no Linear of the model\n", pattern.c_str());
  }
  std::fprintf(stderr, "quantize: %s to %s, %zu Linears observed, %zu excluded; calibrating on %zu input(s) x %d steps\n", f.model.c_str(),
               f.algo.c_str(), calibration.stats().size(), calibration.excluded().size(), data.size(), f.steps);
  for (std::size_t i = 0; i < data.size(); ++i) {
    const auto on_step = [&](int step, int steps, double) {
      // A progress bar per calibration input.
      const int width = 30, filled = width * step / steps;
      std::fprintf(stderr, "\rcalibrating %zu/%zu [%s%s] step %d/%d", i + 1, data.size(),
                   std::string(static_cast<std::size_t>(filled), '#').c_str(),
                   std::string(static_cast<std::size_t>(width - filled), '.').c_str(), step, steps);
      if (step == steps) std::fprintf(stderr, "  %s\n", data[i].first.c_str());
    };
    try {
      model.run(data[i].second, stages, on_step);
    } catch (...) {
      std::fprintf(stderr, "\n");  // end the progress bar's line: the error gets its own
      throw;
    }
  }
  calibration.detach(model.model().transformer_parameters());
  if (calibration_2) {
    calibration_2->detach(*second);
    const auto& stats = calibration_2->stats();
    if (std::none_of(stats.begin(), stats.end(), [](const auto& s) { return s.second->all.seen; }))
      throw Error("transformer_2/ (the low-noise expert) ran in none of the " + std::to_string(f.steps) +
                  " calibration steps (it runs the steps below the boundary_ratio): give more --steps");
  }
  nlohmann::ordered_json json = {{"model", f.model}, {"algorithm", f.algo}, {"steps", f.steps}};
  json.update(export_one(model.model().transformer_parameters(), calibration, options, f, f.out, calibration_2 ? "transformer/: " : ""));
  if (calibration_2) {
    json["transformer_2"] = export_one(*second, *calibration_2, options, f, out_2, "transformer_2/: ");
    std::fprintf(stderr, "run the two experts quantized with --quant %s --quant-2 %s\n", json["description"].get<std::string>().c_str(),
                 json["transformer_2"]["description"].get<std::string>().c_str());
  }
  if (!f.json_path.empty()) write_output_file(f.json_path, "--json", dump_json(json, 2) + "\n");
  return 0;
}

}  // namespace

CommandRunner add_quantize_command(CLI::App& app) {
  auto* command =
      app.add_subcommand("quantize", "Export MindIE SD quantization files (W8A16, W8A8_DYNAMIC, W8A8, W8A8_TIMESTEP) from a float model");
  auto flags = std::make_shared<QuantizeFlags>();
  auto device_flags = add_device_flags(*command);
  command->add_option("--model", flags->model, "Diffusers Flux or Wan folder (float weights)");
  command->add_option("--algo", flags->algo, "W8A16, W8A8_DYNAMIC, W8A8 (static) or W8A8_TIMESTEP");
  command->add_option("--prompt", flags->prompts, "Calibration prompt (repeat for more), through the model's text encoder");
  command->add_option("--calibration-embeds", flags->embeds, "Calibration prompt embeddings (a --prompt-embeds file; repeat for more)");
  command->add_option("--steps", flags->steps, "Denoising steps per calibration run (W8A8_TIMESTEP: one row of scales per step)")
      ->check(in_range(1, 1000));
  command->add_option("--width", flags->width, "Calibration width (default: the model's size; 64 for Wan)")
      ->check(in_range(int64_t{16}, int64_t{4096}));
  command->add_option("--height", flags->height, "Calibration height")->check(in_range(int64_t{16}, int64_t{4096}));
  command->add_option("--frames", flags->frames, "Wan: frames, 1 + 4k (default 5)")->check(in_range(int64_t{1}, int64_t{1025}));
  command->add_option("--seed", flags->seed, "Noise seed of the calibration runs");
  command->add_option("--exclude", flags->exclude, "Keep Linears whose name matches this glob float (repeatable), e.g. 'proj_out'");
  command->add_option("--dtype", flags->dtype, "Calibrate with f32 or bf16 activations");
  command->add_option("--variant", flags->variant, "Read diffusion_pytorch_model.<variant>.safetensors");
  command->add_flag("--deq-scale-int64", flags->deq_int64, "Write deq_scale as int64 bit patterns (as for MindIE SD's fp16 models)");
  command->add_option("--out", flags->out, "Output folder");
  command->add_option("--json", flags->json_path, "Write the per-layer report as JSON")->check(output_file_path());
  command->add_option("--top", flags->top, "Layers to list in the report (default 15)")->check(in_range(0, 100000));
  return [flags, device_flags] { return run(*flags, *device_flags); };
}

}  // namespace cubevec::cli
