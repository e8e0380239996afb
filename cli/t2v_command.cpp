// `cubevec t2v`: text to video with a diffusers Wan2.1 model directory, written as an MJPEG AVI
// (and optionally one JPEG per frame). Frames go to the file as the VAE decodes them, one latent
// frame at a time, so memory does not grow with the frame count. Progress, the stage table, --json
// and --trace as in t2i; --simulate runs the launches with shape-only weights on the device
// profile's modelled clock (config files only).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "cli/output_flag.h"
#include "device/trace.h"
#include "pipelines/avi.h"
#include "cli/attention_tune_cache.h"
#include "cli/command.h"
#include "cli/device_flags.h"
#include "cli/parallel_flags.h"
#include "cli/generation_report.h"
#include "cli/stage_flags.h"
#include "cli/text_conditioning.h"
#include "cli/range_flag.h"
#include "pipelines/generation_defaults.h"
#include "pipelines/patch_parallel_vae.h"
#include "pipelines/wan_t2v.h"
#include "tensor/error.h"
#include "tensor/output_file.h"
#include "tensor/finite_check.h"

namespace cubevec::cli {

namespace {

struct T2VFlags {
  std::string model, out, frames_dir, cfg = "fused";
  PromptFlags text;
  pipelines::T2VOptions options;
  int fps = 16;  // Wan2.1's frame rate
  int quality = 90;
  GenerationFlags common;
};

// Writes each decoded frame to the AVI and, with --frames-dir, as DIR/frame_00000.jpg ...
class FrameWriter {
 public:
  FrameWriter(const T2VFlags& f)
      : avi_(f.out, static_cast<int>(f.options.width), static_cast<int>(f.options.height), f.fps), dir_(f.frames_dir),
        quality_(f.quality) {
    if (!dir_.empty()) {
      std::error_code error;
      std::filesystem::create_directories(dir_, error);
      if (error || !std::filesystem::is_directory(dir_)) throw Error(dir_ + ": cannot create the frames directory");
    }
  }

  void operator()(const Tensor& frames) {
    require_finite(frames, "the VAE decode gave non-finite frames (a VAE weight or setting gives NaN or inf)");
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < frames.size(2); ++i) {
      const pipelines::RgbImage image = pipelines::to_rgb(frames.select(2, i));
      const std::vector<uint8_t> jpeg = pipelines::encode_jpeg(image, quality_, avi_.path());
      avi_.add_frame(jpeg);
      if (!dir_.empty()) {
        char name[32];
        std::snprintf(name, sizeof name, "/frame_%05d.jpg", avi_.frame_count() - 1);
        // Each frame waits in a closed temporary until the video is finished.
        frames_.push_back(std::make_unique<OutputFile>(dir_ + name, "--frames-dir"));
        frames_.back()->write(jpeg.data(), jpeg.size());
        frames_.back()->close();
      }
    }
    encode_s_ += pipelines::seconds_since(t0);
    std::fprintf(stderr, "decoded %d frame(s)\n", avi_.frame_count());
  }

  void finish() {
    avi_.finish();
    for (const auto& frame : frames_) frame->commit();
  }
  int frame_count() const { return avi_.frame_count(); }
  double encode_seconds() const { return encode_s_; }

 private:
  pipelines::MjpegAviWriter avi_;
  std::string dir_;
  std::vector<std::unique_ptr<OutputFile>> frames_;
  int quality_;
  double encode_s_ = 0;
};

// The settings the command line leaves out, from the model folder's generation_defaults.json (the
// shipped tinywan's 64x64 x 17 frames instead of Wan2.1's 832x480 x 81). Returns the flags it set.
std::vector<std::string> apply_generation_defaults(T2VFlags& f, const CLI::App& command) {
  const pipelines::GenerationDefaults d = pipelines::GenerationDefaults::load(f.model);
  std::vector<std::string> applied;
  const auto take = [&](const char* flag, const auto& value, auto& option) {
    if (!value || command.count(flag) != 0) return;
    option = *value;
    applied.push_back(flag);
  };
  take("--width", d.width, f.options.width);
  take("--height", d.height, f.options.height);
  take("--frames", d.frames, f.options.frames);
  take("--steps", d.steps, f.options.steps);
  take("--guidance", d.guidance, f.options.guidance);
  return applied;
}

// The pipeline's request check names flags; a value the defaults file gave is named as the file's.
void check_request(const pipelines::WanT2VPipeline& pipeline, const T2VFlags& f, bool have_negative,
                   const std::vector<std::string>& from_defaults) {
  try {
    pipeline.check(f.options, have_negative);
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& flag : from_defaults)
      if (message.rfind(flag + " ", 0) == 0)
        throw Error(pipelines::GenerationDefaults::path(f.model) + " sets " + flag + ": " + message);
    throw;
  }
}

int run(T2VFlags f, const CLI::App& command, const DeviceFlags& device_flags, const AttentionTuneCacheFlag& cache, const StageFlags& stage_flags,
        const ParallelFlags& parallel_flags) {
  OutputBatch outputs;  // every file this run writes lands at its end, or none does
  if (f.model.empty()) throw Error("--model DIR is required (a diffusers Wan directory: transformer/, vae/, scheduler/)");
  if (!f.common.simulate && f.out.empty()) throw Error("--out FILE.avi is required");
  const std::vector<std::string> from_defaults = apply_generation_defaults(f, command);
  const DType dtype = f.common.weight_dtype();
  f.text.dtype = dtype;
  f.text.check_weights = f.common.check_weights && !f.common.simulate;
  f.text.memory_limit = f.common.memory_limit;
  f.options.cfg = pipelines::parse_cfg_mode(f.cfg);
  // Multi-device: the degrees against the ranks mpirun started, before any work; rank 0 writes.
  const parallel::ParallelGroups groups = parallel_flags.resolve_generation(f.common.simulate, f.options.cfg, f.options.cfg_parallel);
  const bool writer_rank = groups.world.rank() == 0;
  f.options.vae_parallel = parallel_flags.vae_group(groups, f.common.simulate);
  f.options.activations = dtype;
  const pipelines::CacheConfig cache_config = stage_flags.cache_settings();  // bad files fail before any work
  std::unique_ptr<pipelines::Stage> quantize = stage_flags.quantize_stage(f.common.simulate, f.options.steps);
  std::unique_ptr<pipelines::SparseAttentionStage> sparse = stage_flags.sparse_stage();
  const DeviceProfile profile = f.common.profile(device_flags);
  Device device(profile, {.simulate = f.common.simulate, .trace = !f.common.trace_path.empty()});
  cache.load(device);
  default_allocator().reset_peak_stats();

  // Stage 1: the text conditioning and the model. The configs come first (a shape-only model), so
  // the request is checked and its memory estimated before any weight loads.
  auto t0 = std::chrono::steady_clock::now();
  pipelines::WanT2VPipeline pipeline = pipelines::WanT2VPipeline::load_meta(f.model, dtype);
  const TextConditioning text =
      wan_text(f.model, f.text, f.options.cfg != pipelines::CfgMode::off, f.common.simulate, pipeline.transformer().config(),
               device.default_stream());
  const pipelines::PromptEmbeddings& positive = text.positive;
  const std::optional<pipelines::PromptEmbeddings>& negative = text.negative;
  const std::string& text_source = text.source;
  const double text_s = pipelines::seconds_since(t0);
  check_request(pipeline, f, negative.has_value(), from_defaults);
  check_heads(groups, pipeline.transformer().config().num_attention_heads);
  if (f.options.vae_parallel) pipelines::check_row_split(f.options.vae_parallel->size(), f.options.height / 8);
  std::unique_ptr<pipelines::Stage> offload = stage_flags.offload_stage(pipelines::block_modules(pipeline.transformer()), profile.cube_threads);
  const pipelines::MemoryEstimate memory = pipelines::estimate_memory(pipeline, f.options, positive.sequence.size(1),
                                                                     f.options.cfg == pipelines::CfgMode::off ? 1 : 2, stage_flags.offload, profile.cube_threads);
  require_memory(f.common, memory);
  t0 = std::chrono::steady_clock::now();
  if (!f.common.simulate) {
    pipeline = pipelines::WanT2VPipeline::load(f.model, dtype, f.common.variant);
    check_weights(f.common, f.model, pipeline.transformer().parameters(), pipeline.vae() ? &pipeline.vae()->parameters() : nullptr);
  }
  const double load_s = pipelines::seconds_since(t0);
  const models::WanConfig& mc = pipeline.transformer().config();
  pipelines::StageList stage_list = StageFlags::build(std::move(quantize), cache_config, f.options.steps, pipeline.transformer().block_count(),
                                                              std::move(sparse), std::move(offload),
      sequence_parallel_stage(groups),
      tensor_parallel_stage(groups, pipeline.transformer().tensor_parallel_plan()));
  stage_list.after_load(pipeline.mutable_transformer().mutable_parameters());
  // The output files are opened before denoising, so a bad path fails at once, not after it.
  std::optional<FrameWriter> writer;
  if (!f.common.simulate && writer_rank) writer.emplace(f);

  std::fprintf(stderr, "t2v: text: %s\n", text_source.c_str());
  std::fprintf(stderr, "t2v: estimated peak memory %s\n", memory.describe().c_str());
  std::fprintf(stderr, "t2v: scheduler: %s\n", pipelines::scheduler_name(pipeline.scheduler_config()).c_str());
  std::fprintf(stderr,
               "t2v: %lld frames of %lldx%lld (latent %lld x %lld x %lld), %d steps, cfg %s (scale %.2f), transformer %lld blocks x %lld "
               "wide (%s), profile %s: %d Cube + %d Vector thread(s)%s\n",
               static_cast<long long>(f.options.frames), static_cast<long long>(f.options.width), static_cast<long long>(f.options.height),
               static_cast<long long>(f.options.latent_frames()), static_cast<long long>(f.options.height / 8),
               static_cast<long long>(f.options.width / 8), f.options.steps, f.cfg.c_str(), f.options.guidance,
               static_cast<long long>(mc.num_layers), static_cast<long long>(mc.inner_dim()), f.common.dtype.c_str(), profile.name.c_str(),
               profile.cube_threads, profile.vector_threads, f.common.simulate ? ", SIMULATED (modelled times)" : "");

  // Stage 2: denoising, with progress.
  pipelines::T2ITimings timings;
  const double flops_before_denoising = declared_flops(device);
  const Tensor latents =
      pipeline.denoise(positive, negative ? &*negative : nullptr, f.options, device,
                       progress_printer(timings, f.common.simulate, &stage_list), timings, &stage_list);
  PhasePeaks peaks = PhasePeaks::after_denoising();
  const double denoising_flops = declared_flops(device) - flops_before_denoising;

  // Stage 3: the VAE decode, frames streamed to the AVI (and JPEG folder) as they come.
  if (writer) {
    pipeline.decode(latents, f.options, device, [&](const Tensor& frames) { (*writer)(frames); }, timings);
    writer->finish();
  } else if (f.options.vae_parallel) {
    pipeline.decode(latents, f.options, device, [](const Tensor&) {}, timings);  // this rank's bands; rank 0 writes
  }
  device.synchronize();
  const AllocatorStats mem = peaks.finish();
  std::vector<StageTime> stages{{"load", load_s}, {"text encoding", text_s}, {"denoising", timings.denoise_s}};
  if (writer) {
    stages.push_back({"VAE decode", timings.vae_s - writer->encode_seconds()});
    stages.push_back({"JPEG + AVI", writer->encode_seconds()});
  } else if (f.options.vae_parallel) {
    stages.push_back({"VAE decode", timings.vae_s});
  }
  print_stage_table(stages, timings, f.options.steps, profile.name, mem);
  print_stage_report(stage_list);
  print_communication(device);
  if (writer)
    std::fprintf(stderr, "wrote %s (%d frames at %d fps)%s%s\n", f.out.c_str(), writer->frame_count(), f.fps,
                 f.frames_dir.empty() ? "" : " and the frames to ", f.frames_dir.c_str());

  nlohmann::ordered_json json = {{"model", f.model},
                                 {"frames", f.options.frames},
                                 {"width", f.options.width},
                                 {"height", f.options.height},
                                 {"steps", f.options.steps},
                                 {"cfg", f.cfg},
                                 {"guidance", f.options.guidance},
                                 {"seed", f.options.seed},
                                 {"dtype", f.common.dtype},
                                 {"simulate", f.common.simulate},
                                 {"profile", profile.name},
                                 {"scheduler", pipelines::scheduler_name(pipeline.scheduler_config())}};
  json.update(timing_json(stages, timings, mem));
  json["denoising_flops"] = denoising_flops;  // the kernels' declared FLOPs (the bench's GFLOP/s)
  json.update(stage_report_json(stage_list));
  if (groups.world.size() > 1) json["communication"] = communication_json(device);
  json["memory_estimate"] = memory_estimate_json(memory);
  json["measured_peak_bytes"] = peaks.json();
  json["out"] = f.out;
  if (writer_rank) write_outputs(f.common, "t2v", device, json);
  outputs.commit_all();  // the picture, --json and --trace together, only now
  cache.save(device);    // a cache that cannot be saved is a warning, after the run's outputs
  return 0;
}

}  // namespace

CommandRunner add_t2v_command(CLI::App& app) {
  auto* command = app.add_subcommand("t2v", "Text to video with a diffusers Wan2.1 model directory, written as an MJPEG AVI");
  auto flags = std::make_shared<T2VFlags>();
  auto device_flags = add_device_flags(*command);
  auto cache = add_attention_tune_cache_flag(*command);
  auto stage_flags = add_stage_flags(*command);
  command->add_option("--model", flags->model, "Diffusers Wan model directory (transformer/, vae/, scheduler/)");
  command->add_option("--prompt", flags->text.prompt, "The prompt (encoded by the folder's text_encoder/ + tokenizer/: umT5, or the shipped tiny model's own)");
  command->add_option("--negative-prompt", flags->text.negative_prompt, "The negative prompt for CFG (default: the empty prompt)");
  command->add_option("--max-sequence-length", flags->text.max_sequence_length, "umT5 tokens the prompt is padded to (default 512)")
      ->check(in_range(1, 4096))
      ->each([text = &flags->text](const std::string&) { text->max_sequence_length_given = true; });
  command->add_option("--prompt-embeds", flags->text.prompt_embeds,
                      "safetensors with prompt_embeds [1,L,text_dim] (and negative_prompt_embeds for CFG)");
  command->add_option("--frames", flags->options.frames, "Frames, 1 + 4k, the 1 + k latent frames a multiple of the transformer's temporal patch (default 81, or the model folder's generation_defaults.json)")->check(in_range(int64_t{1}, int64_t{4097}));
  command->add_option("--width", flags->options.width, "Width in pixels, a multiple of 8 x the patch size, 16 for Wan2.1 (default 832, or generation_defaults.json's)")
      ->check(in_range(int64_t{16}, int64_t{8192}));
  command->add_option("--height", flags->options.height, "Height in pixels, a multiple of 8 x the patch size, 16 for Wan2.1 (default 480, or generation_defaults.json's)")
      ->check(in_range(int64_t{16}, int64_t{8192}));
  command->add_option("--steps", flags->options.steps, "Denoising steps (default 50, or generation_defaults.json's)")->check(in_range(1, 1000));
  command->add_option("--guidance", flags->options.guidance, "CFG scale: v = v_u + g (v_c - v_u) (default 5, or generation_defaults.json's)")->check(in_range(0.0, 100.0));
  command->add_option("--cfg", flags->cfg, "CFG: fused (one batch of 2, default), streams (two overlapping streams) or off");
  command->add_option("--seed", flags->options.seed, "Noise seed");
  command->add_option("--out", flags->out, "Output MJPEG AVI file")->check(output_file_path());
  command->add_option("--frames-dir", flags->frames_dir, "Also write each frame as DIR/frame_NNNNN.jpg");
  command->add_option("--fps", flags->fps, "Frame rate of the AVI (default 16, Wan2.1's)")->check(in_range(1, 240));
  command->add_option("--quality", flags->quality, "JPEG quality of the frames (default 90)")->check(in_range(1, 100));
  add_generation_flags(*command, flags->common);
  auto parallel_flags = add_parallel_flags(*command, /*cfg_parallel=*/true);
  return [flags, command, device_flags, cache, stage_flags, parallel_flags] {
    return run(*flags, *command, *device_flags, *cache, *stage_flags, *parallel_flags);
  };
}

}  // namespace cubevec::cli
