// `cubevec tune-cache`: searches DiTBlockCache and AttentionCache settings for a target speedup as
// MindIE SD documents it (pipelines/cache_tuner.h) on a Flux or Wan model folder, prints each
// trial on stderr and the chosen settings on stdout as JSON that --cache-config reads.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/output_flag.h"
#include "cli/attention_tune_cache.h"
#include "cli/command.h"
#include "cli/device_flags.h"
#include "cli/fixed_shape_run.h"
#include "cli/range_flag.h"
#include "pipelines/cache_tuner.h"
#include "base/error.h"
#include "base/output_file.h"
#include "base/json_text.h"

namespace cubevec::cli {

namespace {

struct CacheTuneFlags {
  std::string model, method = "both", out, dtype = "f32", variant;
  pipelines::PromptRequest text;
  double target = 1.6;
  int steps = 28, max_trials = 6, step_start = -1, interval = -1;
  int64_t width = 0, height = 0, frames = 5;
  uint64_t seed = 0;
};

int run(const CacheTuneFlags& f, const DeviceFlags& device_flags, const AttentionTuneCacheFlag& cache) {
  if (f.model.empty()) throw Error("--model DIR is required (a diffusers Flux or Wan folder)");
  const DType dtype = parse_dtype(f.dtype);
  if (dtype != DType::f32 && dtype != DType::bf16) throw Error("--dtype must be f32 or bf16, got " + f.dtype);
  pipelines::CacheTuneOptions options;
  options.target_speedup = f.target;
  options.max_trials = f.max_trials;
  if (f.method == "dit-block") options.methods = {pipelines::CacheMethod::dit_block};
  else if (f.method == "attention") options.methods = {pipelines::CacheMethod::attention};
  else if (f.method != "both") throw Error("--method must be dit-block, attention or both, got '" + f.method + "'");
  if (f.step_start >= 0) options.step_start = f.step_start;
  if (f.interval >= 0) {
    if (f.interval < 2)
      throw Error("--cache-interval must be at least 2 for tuning (1 computes every step), got " + std::to_string(f.interval));
    options.interval = f.interval;
  }
  Device device(device_flags.resolve());
  cache.load(device);

  const FixedShapeRun model(f.model, dtype, f.variant, {f.steps, f.width, f.height, f.frames, f.seed}, device);
  const pipelines::TextConditioning text = model.text(f.text);
  const int blocks = model.model().blocks();
  const pipelines::CacheTuneRun generate = [&](pipelines::StageList& stages) { return model.run(text.positive, stages); };
  std::fprintf(stderr, "tune-cache: %s, %d steps, %d blocks, target %.2fx; text: %s\n", f.model.c_str(), f.steps, blocks, f.target,
               text.source.c_str());
  const pipelines::CacheTuneResult result = pipelines::tune_cache(
      generate, f.steps, blocks, options, [](const std::string& what) { std::fprintf(stderr, "running: %s\n", what.c_str()); });
  std::fprintf(stderr, "\nreference (no cache): %.3f s of denoising\n%-44s %9s %8s %12s %12s\n", result.reference_seconds, "candidate",
               "seconds", "speedup", "MSE", "proxy");
  for (const auto& t : result.trials)
    std::fprintf(stderr, "%-44s %9.3f %7.2fx %12.4g %12.4g%s\n", t.config.describe().c_str(), t.seconds, t.speedup, t.mse, t.proxy,
                 t.reaches_target ? "" : "  (below target)");
  for (const auto& note : result.notes) std::fprintf(stderr, "note: %s\n", note.c_str());
  cache.save(device);
  if (!result.chosen)
    throw Error("no setting reached " + std::to_string(f.target).substr(0, 4) +
                "x on this run (see the trials above); try a lower "
                "--target-speedup, more --steps or another --cache-step-start / --cache-interval");
  const std::string json = dump_json(result.chosen->config.to_json(), 2);
  std::printf("%s\n", json.c_str());
  std::fprintf(stderr, "chosen: %.2fx at MSE %.4g\n", result.chosen->speedup, result.chosen->mse);
  if (!f.out.empty()) {
    write_output_file(f.out, "--out", json + "\n");
  }
  return 0;
}

}  // namespace

CommandRunner add_tune_cache_command(CLI::App& app) {
  auto* command =
      app.add_subcommand("tune-cache", "Search DiTBlockCache / AttentionCache settings for a target speedup (MindIE SD's method)");
  auto flags = std::make_shared<CacheTuneFlags>();
  auto device_flags = add_device_flags(*command);
  auto cache = add_attention_tune_cache_flag(*command);
  command->add_option("--model", flags->model, "Diffusers Flux or Wan model folder");
  command->add_option("--prompt", flags->text.prompt, "The prompt (through the model's text encoder)");
  command->add_option("--max-sequence-length", flags->text.max_sequence_length, "T5 / umT5 tokens the prompt is padded to (default 512)")
      ->check(in_range(1, 4096))
      ->each([text = &flags->text](const std::string&) { text->max_sequence_length_given = true; });
  command->add_option("--prompt-embeds", flags->text.prompt_embeds, "safetensors with prompt_embeds (and pooled_prompt_embeds for Flux)");
  command->add_option("--target-speedup", flags->target, "Denoising speedup to reach (default 1.6)");
  command->add_option("--method", flags->method, "dit-block, attention or both (default)");
  command->add_option("--steps", flags->steps, "Denoising steps (default 28)")->check(in_range(2, 1000));
  command->add_option("--width", flags->width, "Width (default: the model's size; 64 for Wan)")
      ->check(in_range(int64_t{16}, int64_t{4096}));
  command->add_option("--height", flags->height, "Height")->check(in_range(int64_t{16}, int64_t{4096}));
  command->add_option("--frames", flags->frames, "Wan: frames, 1 + 4k (default 5)")->check(in_range(int64_t{1}, int64_t{1025}));
  command->add_option("--seed", flags->seed, "Noise seed");
  command->add_option("--cache-step-start", flags->step_start, "dit-block: first replayable step (default steps / 5)");
  command->add_option("--cache-interval", flags->interval, "dit-block: compute every N steps (default 2)");
  command->add_option("--max-trials", flags->max_trials, "Full runs per method (default 6)")->check(in_range(1, 100));
  command->add_option("--dtype", flags->dtype, "f32 or bf16");
  command->add_option("--variant", flags->variant, "Read diffusion_pytorch_model.<variant>.safetensors");
  command->add_option("--out", flags->out, "Also write the chosen JSON to this file")->check(output_file_path());
  return [flags, device_flags, cache] { return run(*flags, *device_flags, *cache); };
}

}  // namespace cubevec::cli
