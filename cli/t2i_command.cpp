// `cubevec t2i`: text-to-image with a diffusers Flux model directory: progress per step on
// stderr, then a per-stage timing table and the allocator's peak memory; --json writes the same
// figures, --trace a Chrome trace of every kernel. --simulate runs the same launches with
// shape-only weights on the device profile's modelled clock (config files only).
// The text conditioning comes from --prompt-embeds, or, when the model directory has a
// text_encoder/ (the shipped tiny model, assets/tinyflux), from --prompt through that encoder.
// Without --width / --height the image has the model's own size (the VAE's sample_size).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/output_flag.h"
#include "cli/attention_tune_cache.h"
#include "cli/command.h"
#include "cli/device_flags.h"
#include "cli/parallel_flags.h"
#include "cli/generation_report.h"
#include "cli/stage_flags.h"
#include "cli/text_conditioning.h"
#include "cli/range_flag.h"
#include "pipelines/flux_t2i.h"
#include "pipelines/jpeg.h"
#include "models/tiny_text_encoder.h"
#include "tensor/error.h"
#include "tensor/output_file.h"
#include "tensor/finite_check.h"

namespace cubevec::cli {

namespace {

struct T2IFlags {
  std::string model, out, cfg = "off";
  PromptFlags text;
  pipelines::T2IOptions options;
  GenerationFlags common;
};

int run(T2IFlags f, const DeviceFlags& device_flags, const AttentionTuneCacheFlag& cache, const StageFlags& stage_flags,
        const ParallelFlags& parallel_flags) {
  OutputBatch outputs;  // every file this run writes lands at its end, or none does
  if (f.model.empty()) throw Error("--model DIR is required (a diffusers Flux directory: transformer/, vae/, scheduler/)");
  if (!f.common.simulate && f.out.empty()) throw Error("--out FILE.jpg is required");
  const DType dtype = f.common.weight_dtype();
  f.text.dtype = dtype;
  f.text.check_weights = f.common.check_weights && !f.common.simulate;
  f.text.memory_limit = f.common.memory_limit;
  f.options.cfg = pipelines::parse_cfg_mode(f.cfg);
  // Multi-device: the degrees against the ranks mpirun started, before any work; rank 0 writes.
  const parallel::ParallelGroups groups = parallel_flags.resolve_generation(f.common.simulate, f.options.cfg, f.options.cfg_parallel);
  const bool writer_rank = groups.world.rank() == 0;
  f.options.vae_parallel = parallel_flags.vae_group(groups, f.common.simulate);
  const bool decoder_rank = writer_rank || f.options.vae_parallel;
  f.options.activations = dtype;
  const pipelines::CacheConfig cache_config = stage_flags.cache_settings();  // bad files fail before any work
  std::unique_ptr<pipelines::Stage> quantize = stage_flags.quantize_stage(f.common.simulate, f.options.steps);
  std::unique_ptr<pipelines::SparseAttentionStage> sparse = stage_flags.sparse_stage();
  if (sparse && sparse->config().type == ops::SparseType::rf_v2)
    throw Error("--sparse rf_v2 keeps the first frame's blocks whole (MindIE SD's RainFusion), and an image is one frame: it would skip "
                "nothing; use --sparse ada_bsa for images");
  const DeviceProfile profile = f.common.profile(device_flags);
  Device device(profile, {.simulate = f.common.simulate, .trace = !f.common.trace_path.empty()});
  cache.load(device);
  default_allocator().reset_peak_stats();

  // Stage 1: the text conditioning and the model. The configs come first (a shape-only model), so
  // the request is checked and its memory estimated before any weight loads.
  auto t0 = std::chrono::steady_clock::now();
  pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load_meta(f.model, dtype);
  // Width and height not given: the model's own size (the VAE's sample_size; 1024 for FLUX.1).
  if (f.options.width == 0) f.options.width = pipeline.default_image_size();
  if (f.options.height == 0) f.options.height = pipeline.default_image_size();
  const TextConditioning text = flux_text(f.model, f.text, f.options.cfg != pipelines::CfgMode::off, f.common.simulate,
                                          pipeline.transformer().config(), device.default_stream());
  const pipelines::PromptEmbeddings& positive = text.positive;
  const std::optional<pipelines::PromptEmbeddings>& negative = text.negative;
  const std::string& text_source = text.source;
  const double text_s = pipelines::seconds_since(t0);
  pipeline.check(f.options, negative.has_value());
  check_heads(groups, pipeline.transformer().config().num_attention_heads);
  std::unique_ptr<pipelines::Stage> offload = stage_flags.offload_stage(pipelines::block_modules(pipeline.transformer()), profile.cube_threads);
  const pipelines::MemoryEstimate memory = pipelines::estimate_memory(pipeline, f.options, positive.sequence.size(1),
                                                                     f.options.cfg == pipelines::CfgMode::off ? 1 : 2, stage_flags.offload, profile.cube_threads);
  require_memory(f.common, memory);
  t0 = std::chrono::steady_clock::now();
  if (!f.common.simulate) {
    pipeline = pipelines::FluxT2IPipeline::load(f.model, dtype, f.common.variant);
    check_weights(f.common, f.model, pipeline.transformer().parameters(), pipeline.vae() ? &pipeline.vae()->parameters() : nullptr);
  }
  const double load_s = pipelines::seconds_since(t0);
  const models::FluxConfig& mc = pipeline.transformer().config();
  pipelines::StageList stage_list = StageFlags::build(std::move(quantize), cache_config, f.options.steps, pipeline.transformer().block_count(),
                                                              std::move(sparse), std::move(offload),
      sequence_parallel_stage(groups),
      tensor_parallel_stage(groups, pipeline.transformer().tensor_parallel_plan()));
  stage_list.after_load(pipeline.mutable_transformer().mutable_parameters());

  std::fprintf(stderr, "t2i: text: %s\n", text_source.c_str());
  std::fprintf(stderr, "t2i: estimated peak memory %s\n", memory.describe().c_str());
  std::fprintf(stderr, "t2i: %lldx%lld, %d steps, cfg %s, %s, transformer %lld+%lld blocks x %lld wide (%s), profile %s: %d Cube + %d Vector thread(s)%s\n",
               static_cast<long long>(f.options.width), static_cast<long long>(f.options.height), f.options.steps, f.cfg.c_str(),
               mc.guidance_embeds ? ("guidance " + std::to_string(f.options.guidance)).c_str() : "no guidance embedding",
               static_cast<long long>(mc.num_layers), static_cast<long long>(mc.num_single_layers),
               static_cast<long long>(mc.inner_dim()), f.common.dtype.c_str(), profile.name.c_str(), profile.cube_threads,
               profile.vector_threads, f.common.simulate ? ", SIMULATED (modelled times)" : "");

  if (f.options.vae_parallel && pipeline.vae()) {
    const int64_t up = pipeline.vae()->config().upscale();
    const int64_t tiles = pipeline.vae()->tile_count(f.options.height / up, f.options.width / up);
    if (tiles == 1)
      std::fprintf(stderr, "t2i: --vae-parallel: the latent fits in one VAE tile, so every rank decodes it whole (no speedup)\n");
    else
      std::fprintf(stderr, "t2i: --vae-parallel: %lld VAE tiles dealt over %d ranks\n", static_cast<long long>(tiles), f.options.vae_parallel->size());
  }

  // Stage 2: denoising, with progress.
  pipelines::T2ITimings timings;
  const double flops_before_denoising = declared_flops(device);
  const auto on_step = progress_printer(timings, f.common.simulate, &stage_list);
  const Tensor latents =
      pipeline.denoise(positive, negative ? &*negative : nullptr, f.options, device, on_step, timings, &stage_list);
  PhasePeaks peaks = PhasePeaks::after_denoising();
  const double denoising_flops = declared_flops(device) - flops_before_denoising;

  // Stage 3 and 4: VAE decode and JPEG.
  double jpeg_s = 0;
  if (!f.common.simulate && decoder_rank) {
    const Tensor image = pipeline.decode(latents, f.options, device, timings);
    if (writer_rank) {
      require_finite(image, "the VAE decode gave a non-finite picture (a VAE weight or setting gives NaN or inf)");
      t0 = std::chrono::steady_clock::now();
      pipelines::write_jpeg(f.out, pipelines::to_rgb(image));
      jpeg_s = pipelines::seconds_since(t0);
    }
  }
  device.synchronize();
  const AllocatorStats mem = peaks.finish();
  std::vector<StageTime> stages{{"load", load_s}, {"text encoding", text_s}, {"denoising", timings.denoise_s}};
  if (!f.common.simulate && decoder_rank) stages.push_back({"VAE decode", timings.vae_s});
  if (!f.common.simulate && writer_rank) stages.push_back({"JPEG encode", jpeg_s});
  print_stage_table(stages, timings, f.options.steps, profile.name, mem);
  print_stage_report(stage_list);
  print_communication(device);
  if (!f.common.simulate && writer_rank) std::fprintf(stderr, "wrote %s\n", f.out.c_str());

  nlohmann::ordered_json json = {
      {"model", f.model},
      {"width", f.options.width},
      {"height", f.options.height},
      {"steps", f.options.steps},
      {"cfg", f.cfg},
      {"seed", f.options.seed},
      {"dtype", f.common.dtype},
      {"simulate", f.common.simulate},
      {"profile", profile.name}};
  json.update(timing_json(stages, timings, mem));
  json["denoising_flops"] = denoising_flops;  // the kernels' declared FLOPs (the bench's GFLOP/s)
  json.update(stage_report_json(stage_list));
  if (groups.world.size() > 1) json["communication"] = communication_json(device);
  json["memory_estimate"] = memory_estimate_json(memory);
  json["measured_peak_bytes"] = peaks.json();
  json["out"] = f.out;
  if (writer_rank) write_outputs(f.common, "t2i", device, json);
  outputs.commit_all();  // the picture, --json and --trace together, only now
  cache.save(device);    // a cache that cannot be saved is a warning, after the run's outputs
  return 0;
}

}  // namespace

CommandRunner add_t2i_command(CLI::App& app) {
  auto* command = app.add_subcommand("t2i", "Text to image with a diffusers Flux model directory, written as JPEG");
  auto flags = std::make_shared<T2IFlags>();
  auto device_flags = add_device_flags(*command);
  auto cache = add_attention_tune_cache_flag(*command);
  auto stage_flags = add_stage_flags(*command);
  command->add_option("--model", flags->model, "Diffusers model directory (transformer/, vae/, scheduler/)");
  command->add_option("--prompt", flags->text.prompt,
                      "The prompt (encoded by the folder's text_encoder/ + tokenizer/ (CLIP) and text_encoder_2/ + tokenizer_2/ (T5))");
  command->add_option("--max-sequence-length", flags->text.max_sequence_length, "T5 tokens the prompt is padded to (default 512)")
      ->check(in_range(1, 512))
      ->each([text = &flags->text](const std::string&) { text->max_sequence_length_given = true; });
  command->add_option("--negative-prompt", flags->text.negative_prompt, "The negative prompt for true CFG (default: the empty prompt)");
  command->add_option("--prompt-embeds", flags->text.prompt_embeds,
                      "safetensors with prompt_embeds [1,L,D] and pooled_prompt_embeds [1,P] (and negative_* for CFG)");
  flags->options.width = flags->options.height = 0;  // the model's size unless given
  command->add_option("--width", flags->options.width, "Image width in pixels (default: the VAE's sample_size, 1024 for FLUX.1)")
      ->check(in_range(int64_t{16}, int64_t{16384}));
  command->add_option("--height", flags->options.height, "Image height in pixels (default: the VAE's sample_size)")
      ->check(in_range(int64_t{16}, int64_t{16384}));
  command->add_option("--steps", flags->options.steps, "Denoising steps")->check(in_range(1, 1000));
  command->add_option("--guidance", flags->options.guidance, "Embedded guidance scale (guidance-distilled models)")->check(in_range(0.0, 100.0));
  command->add_option("--cfg", flags->cfg, "True CFG: off, fused (one batch of 2) or streams (two overlapping streams)");
  command->add_option("--cfg-scale", flags->options.cfg_scale, "True CFG scale")->check(in_range(0.0, 100.0));
  command->add_option("--seed", flags->options.seed, "Noise seed");
  command->add_option("--out", flags->out, "Output JPEG file")->check(output_file_path());
  add_generation_flags(*command, flags->common);
  auto parallel_flags = add_parallel_flags(*command, /*cfg_parallel=*/true);
  return [flags, device_flags, cache, stage_flags, parallel_flags] {
    return run(*flags, *device_flags, *cache, *stage_flags, *parallel_flags);
  };
}

}  // namespace cubevec::cli
