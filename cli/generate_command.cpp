// `cubevec t2i` (a Flux folder, written as JPEG) and `cubevec t2v` (a Wan folder, written as an
// MJPEG AVI and optionally one JPEG per frame): one request through the generation library
// (pipelines/pipeline.h). The flags become the library's Request and LoadOptions; the run takes
// the one-shot path (PipelinePlan): configs, request checks and the memory estimate before any
// weight loads, the text encoders loaded for the prompt and freed before the transformer loads.
// Progress per step on stderr, then a per-stage timing table and the peak memory; --json writes
// the same figures, --trace a Chrome trace of every kernel. --simulate runs the same launches with
// shape-only weights on the device profile's modelled clock (config files only). A video's frames
// go to the file as the VAE decodes them, so memory does not grow with the frame count.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/attention_tune_cache.h"
#include "cli/command.h"
#include "cli/device_flags.h"
#include "cli/generation_flags.h"
#include "cli/output_flag.h"
#include "cli/parallel_flags.h"
#include "cli/range_flag.h"
#include "cli/run_printing.h"
#include "cli/stage_flags.h"
#include "media/avi.h"
#include "media/jpeg.h"
#include "media/png.h"
#include "pipelines/pipeline.h"
#include "pipelines/seconds_since.h"
#include "base/error.h"
#include "base/output_file.h"

namespace cubevec::cli {

namespace {

enum class Task { t2i, t2v };

struct GenerateFlags {
  Task task = Task::t2i;
  std::string model, out, frames_dir, cfg, image, mask, last_image;
  double strength = 0.6;
  bool edit = false, no_auto_resize = false;  // --edit, --no-auto-resize (FLUX.1 Kontext)
  int64_t max_area = 0;                       // --max-area (FLUX.1 Kontext)
  pipelines::PromptRequest text;
  int64_t width = 0, height = 0, frames = 0;
  int steps = 0;
  double guidance = 0, cfg_scale = 0, guidance_2 = 0;
  uint64_t seed = 0;
  int fps = 16;  // Wan2.1's frame rate
  int quality = 90;
  GenerationFlags common;

  const char* name() const { return task == Task::t2i ? "t2i" : "t2v"; }
};

// Writes each decoded chunk of frames to the AVI (MJPEG) and, with --frames-dir, as lossless
// DIR/frame_00000.png ...
class FrameWriter {
 public:
  FrameWriter(const GenerateFlags& f, int64_t width, int64_t height, int64_t frames)
      : avi_(f.out, static_cast<int>(width), static_cast<int>(height), f.fps), dir_(f.frames_dir), quality_(f.quality) {
    if (!dir_.empty()) {
      std::error_code error;
      // The folder itself, not its parents: a mistyped parent is an error, not a new tree.
      std::filesystem::path folder(dir_);
      if (!folder.has_filename()) folder = folder.parent_path();  // "frames/"
      const std::filesystem::path parent = folder.parent_path();
      if (!parent.empty() && !std::filesystem::is_directory(parent, error))
        throw Error("--frames-dir " + dir_ + ": its parent folder " + parent.string() +
                    " does not exist (cubevec creates the frames folder, not its parents)");
      created_ = std::filesystem::create_directory(dir_, error);
      if (error || !std::filesystem::is_directory(dir_)) throw Error("--frames-dir " + dir_ + ": cannot create the frames folder");
      // A frame's path that is a folder, a link or a device fails now, not after the denoising.
      for (int64_t i = 0; i < frames; ++i) {
        const std::string path = frame_path(i);
        const auto status = std::filesystem::symlink_status(path, error);
        if (!error && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
          throw Error("--frames-dir " + dir_ + ": " + path +
                      " is not a regular file (a folder, a link or a device); the frame cannot be "
                      "written there");
      }
    }
  }

  // A run that ends before its video is written (an error, Ctrl-C) leaves no frames folder it made:
  // the frames' temporaries go first, then the folder if nothing else is in it (remove never
  // deletes a folder that is not empty).
  ~FrameWriter() {
    if (!created_ || finished_) return;
    frames_.clear();
    std::error_code ignored;
    std::filesystem::remove(dir_, ignored);
  }
  FrameWriter(const FrameWriter&) = delete;
  FrameWriter& operator=(const FrameWriter&) = delete;

  void operator()(const Tensor& frames) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < frames.size(2); ++i) {
      const media::RgbImage image = media::to_rgb(frames.select(2, i));
      avi_.add_frame(media::encode_jpeg(image, quality_, avi_.path()));
      if (!dir_.empty()) {
        const std::string path = frame_path(avi_.frame_count() - 1);
        // Each frame waits in a closed temporary until the video is finished.
        frames_.push_back(std::make_unique<OutputFile>(path, "--frames-dir"));
        const std::vector<uint8_t> png = media::encode_png(image, path);
        frames_.back()->write(png.data(), png.size());
        frames_.back()->close();
      }
    }
    encode_s_ += pipelines::seconds_since(t0);
    std::fprintf(stderr, "decoded %d frame(s)\n", avi_.frame_count());
  }

  void finish() {
    avi_.finish();
    for (const auto& frame : frames_) frame->commit();
    finished_ = true;
  }
  int frame_count() const { return avi_.frame_count(); }
  double encode_seconds() const { return encode_s_; }

 private:
  // DIR/frame_NNNNN.png, the name --frames-dir promises.
  std::string frame_path(int64_t index) const {
    char name[32];
    std::snprintf(name, sizeof name, "/frame_%05lld.png", static_cast<long long>(index));
    return dir_ + name;
  }

  media::MjpegAviWriter avi_;
  std::string dir_;
  std::vector<std::unique_ptr<OutputFile>> frames_;
  int quality_;
  double encode_s_ = 0;
  bool created_ = false;   // the frames folder did not exist before this run
  bool finished_ = false;  // the video and its frames were written
};

// The flags as the library's request: the ones given; the model's defaults fill the rest.
pipelines::Request request_of(const GenerateFlags& f, const CLI::App& command, const StageFlags& stage_flags) {
  pipelines::Request r;
  r.text = f.text;
  const bool image = f.task == Task::t2i;
  // Each command has its own flags: CLI11 throws for a name it does not know.
  const auto given = [&](const char* flag) { return command.get_option_no_throw(flag) != nullptr && command.count(flag) != 0; };
  if (given("--width")) r.width = f.width;
  if (given("--height")) r.height = f.height;
  if (!image && given("--frames")) r.num_frames = f.frames;
  if (given("--steps")) r.num_inference_steps = f.steps;
  if (given("--guidance")) r.guidance_scale = f.guidance;
  if (!image && given("--guidance-2")) r.guidance_scale_2 = f.guidance_2;
  if (image && given("--cfg-scale")) r.true_cfg_scale = f.cfg_scale;
  for (const auto& [flag, path] :
       {std::pair<const char*, const std::string*>{"--image", &f.image}, {"--mask", &f.mask}, {"--last-image", &f.last_image}})
    if (given(flag) && path->empty()) throw Error(std::string(flag) + ": expected a PNG or JPEG file, got an empty path");
  r.image = f.image;
  r.mask_image = f.mask;
  r.last_image = f.last_image;
  if (image && given("--strength")) r.strength = f.strength;
  if (image && f.edit) r.edit = true;
  if (image && given("--max-area")) r.max_area = f.max_area;
  if (image && f.no_auto_resize) r.auto_resize = false;
  r.cfg = f.cfg;
  r.seed = f.seed;
  r.cache = stage_flags.cache_settings();  // bad files fail before any work
  if (const std::unique_ptr<pipelines::SparseAttentionStage> sparse = stage_flags.sparse_stage()) r.sparse = sparse->config();
  r.quant_attention = pipelines::parse_attention_quant(stage_flags.quant_attention);
  return r;
}

int run(GenerateFlags f, const CLI::App& command, const DeviceFlags& device_flags, const AttentionTuneCacheFlag& cache,
        const StageFlags& stage_flags, const ParallelFlags& parallel_flags) {
  OutputBatch outputs;  // every file this run writes lands at its end, or none does
  const bool image = f.task == Task::t2i;
  if (f.model.empty())
    throw Error(std::string("--model DIR is required (a diffusers ") + (image ? "Flux" : "Wan") +
                " directory: transformer/, vae/, scheduler/)");
  if (!f.common.simulate && f.out.empty()) throw Error(image ? "--out FILE.png or FILE.jpg is required" : "--out FILE.avi is required");
  const media::ImageFormat picture_format = image && !f.out.empty() ? media::image_format_for(f.out, "--out") : media::ImageFormat::png;
  pipelines::Request request = request_of(f, command, stage_flags);
  pipelines::LoadOptions load;
  load.dtype = f.common.weight_dtype();
  load.variant = f.common.variant;
  load.check_weights = f.common.check_weights;
  load.memory_limit = f.common.memory_limit;
  load.quant = stage_flags.quant_given() ? stage_flags.quant : "";
  load.quant_2 = stage_flags.quant_2;
  load.timestep_policy = stage_flags.timestep_policy;
  load.offload = stage_flags.offload;
  load.packed_cache = f.common.packed_cache;
  load.lora = f.common.lora;
  load.lora_ignore_unmatched = f.common.lora_ignore_unmatched;
  load.lora_mode = f.common.lora_mode;
  load.simulate = f.common.simulate;
  load.trace = !f.common.trace_path.empty();
  // Multi-device: the degrees against the ranks mpirun started, before any work; rank 0 writes.
  load.groups = parallel_flags.resolve_generation(f.common.simulate, pipelines::parse_cfg_mode(f.cfg), load.cfg_parallel);
  const bool writer_rank = load.groups->world.rank() == 0;
  load.vae_parallel = parallel_flags.vae_group(*load.groups, f.common.simulate);
  load.profile = f.common.profile(device_flags);
  const DeviceProfile& profile = *load.profile;
  Device device(profile, {.simulate = f.common.simulate, .trace = load.trace});
  cache.load(device);
  default_allocator().reset_peak_stats();

  // Stage 1: the configs (a shape-only model) and the text conditioning, so the request is checked
  // and its memory estimated before any weight loads.
  auto t0 = std::chrono::steady_clock::now();
  pipelines::PipelinePlan plan = pipelines::PipelinePlan::read(f.model, load, image ? "flux" : "wan", &request);
  request = plan.with_defaults(request);
  const pipelines::TextConditioning text = plan.encode_text(request, device.default_stream());
  const double text_s = pipelines::seconds_since(t0);
  plan.check(request, text.negative.has_value());
  const pipelines::MemoryEstimate memory = plan.require_memory(request, text.positive.sequence.size(1));
  const std::vector<std::string> description =
      plan.model().describe(request, {load.dtype, load.cfg_parallel, load.vae_parallel}, f.common.dtype, profile, f.common.simulate);
  const std::unique_ptr<pipelines::Pipeline> pipeline = std::move(plan).load();
  const double load_s = pipeline->load_seconds();
  if (pipeline->packed_cache()) print_packed_cache(f.name(), *pipeline->packed_cache());

  // The output files are opened before denoising, so a bad path fails at once, not after it.
  std::optional<FrameWriter> writer;
  if (!image && !f.common.simulate && writer_rank) writer.emplace(f, *request.width, *request.height, *request.num_frames);
  std::fprintf(stderr, "%s: text: %s\n", f.name(), text.source.c_str());
  std::fprintf(stderr, "%s: estimated peak memory %s\n", f.name(), memory.describe().c_str());
  for (const std::string& line : description) std::fprintf(stderr, "%s: %s\n", f.name(), line.c_str());

  // Stage 2 to 4: denoising with progress, the VAE decode, the picture or the frames.
  double encode_s = 0;
  pipelines::GenerateHooks hooks;
  hooks.device = &device;
  hooks.text = &text;
  hooks.on_step = progress_printer(f.common.simulate);
  hooks.on_pixels = [&](const Tensor& pixels) {
    if (writer) {
      (*writer)(pixels);
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    media::write_image(f.out, media::to_rgb(pixels), picture_format);
    encode_s = pipelines::seconds_since(start);
  };
  pipelines::GenerationResult result = pipeline->generate(request, hooks);
  result.text_s = text_s;
  if (writer) writer->finish();

  std::vector<pipelines::StageTime> stages{{"load", load_s}, {"text encoding", text_s}};
  if (result.timings.image_s > 0) stages.push_back({"image encoding", result.timings.image_s});
  stages.push_back({"denoising", result.timings.denoise_s});
  if (writer) {
    stages.push_back({"VAE decode", result.timings.vae_s - writer->encode_seconds()});
    stages.push_back({"JPEG + AVI", writer->encode_seconds()});
  } else if (result.decoded) {
    stages.push_back({"VAE decode", result.timings.vae_s});
    if (image && writer_rank) stages.push_back({picture_format == media::ImageFormat::png ? "PNG encode" : "JPEG encode", encode_s});
  }
  print_stage_table(stages, result.timings, *request.num_inference_steps, profile.name, result.allocator);
  print_stage_report(result.stages);
  print_communication(device);
  if (writer)
    std::fprintf(stderr, "wrote %s (%d frames at %d fps)%s%s\n", f.out.c_str(), writer->frame_count(), f.fps,
                 f.frames_dir.empty() ? "" : " and the frames to ", f.frames_dir.c_str());
  else if (image && result.decoded && writer_rank) std::fprintf(stderr, "wrote %s\n", f.out.c_str());

  nlohmann::ordered_json json = pipelines::generation_report(*pipeline, result, stages, device);
  json["out"] = f.out;
  if (writer_rank) write_outputs(f.common, f.name(), device, json);
  outputs.commit_all();  // the picture, --json and --trace together, only now
  cache.save(device);    // a cache that cannot be saved is a warning, after the run's outputs
  return 0;
}

CommandRunner add_generate_command(CLI::App& app, Task task) {
  const bool image = task == Task::t2i;
  auto* command = image ? app.add_subcommand("t2i", "Text to image with a diffusers Flux model directory, written as PNG or JPEG")
                        : app.add_subcommand("t2v",
                                             "Text (and image) to video with a diffusers Wan model directory (Wan2.1 T2V / I2V / FLF2V, "
                                             "Wan2.2 A14B), written as an MJPEG AVI");
  auto flags = std::make_shared<GenerateFlags>();
  flags->task = task;
  flags->cfg = image ? "off" : "fused";
  auto device_flags = add_device_flags(*command);
  auto cache = add_attention_tune_cache_flag(*command);
  auto stage_flags = add_stage_flags(*command);
  GenerateFlags& f = *flags;
  if (image) {
    command->add_option("--model", f.model, "Diffusers model directory (transformer/, vae/, scheduler/)");
    command->add_option("--prompt", f.text.prompt,
                        "The prompt (encoded by the folder's text_encoder/ + tokenizer/ (CLIP) and text_encoder_2/ + tokenizer_2/ (T5))");
    command->add_option("--max-sequence-length", f.text.max_sequence_length, "T5 tokens the prompt is padded to (default 512)")
        ->check(in_range(1, 512))
        ->each([text = &f.text](const std::string&) { text->max_sequence_length_given = true; });
    command->add_option("--negative-prompt", f.text.negative_prompt, "The negative prompt for true CFG (default: the empty prompt)");
    command->add_option("--prompt-embeds", f.text.prompt_embeds,
                        "safetensors with prompt_embeds [1,L,D] and pooled_prompt_embeds [1,P] (and negative_* for CFG)");
    command->add_option("--width", f.width, "Image width in pixels (default: the VAE's sample_size, 1024 for FLUX.1)")
        ->check(in_range(int64_t{16}, int64_t{16384}));
    command->add_option("--height", f.height, "Image height in pixels (default: the VAE's sample_size)")
        ->check(in_range(int64_t{16}, int64_t{16384}));
    command->add_option("--steps", f.steps, "Denoising steps (default 28)")->check(in_range(1, 1000));
    command->add_option("--guidance", f.guidance, "Embedded guidance scale (guidance-distilled models; default 3.5)")
        ->check(in_range(0.0, 100.0));
    command->add_option("--cfg", f.cfg, "True CFG: off, fused (one batch of 2) or streams (two overlapping streams)");
    command->add_option("--cfg-scale", f.cfg_scale, "True CFG scale (default 4)")->check(in_range(0.0, 100.0));
    command->add_option("--seed", f.seed, "Noise seed");
    command->add_option("--image", f.image,
                        "Image-to-image: start from this picture (PNG or JPEG), resized to the output size (FluxImg2ImgPipeline)");
    command->add_option("--mask", f.mask, "Inpainting: white where --image is repainted, black where it is kept (FluxInpaintPipeline)");
    command->add_option("--strength", f.strength, "How much of --image is repainted, (0, 1]: 1 starts from noise (default 0.6)")
        ->check(in_range(0.0, 1.0));
    command->add_flag("--edit", f.edit,
                      "FLUX.1 Kontext editing: --image is a reference the prompt edits (the default on a FluxKontextPipeline folder)");
    command
        ->add_option("--max-area", f.max_area,
                     "Kontext: the output's pixels; width and height are rescaled to it at their aspect ratio (default 1048576)")
        ->check(in_range(int64_t{256}, int64_t{16384} * 16384));
    command->add_flag("--no-auto-resize", f.no_auto_resize,
                      "Kontext: keep --image's own size (floored to 16) instead of the nearest of Kontext's preferred resolutions");
    command->add_option("--out", f.out, "Output picture: FILE.png (lossless) or FILE.jpg")->check(output_file_path());
  } else {
    command->add_option("--model", f.model, "Diffusers Wan model directory (transformer/, vae/, scheduler/)");
    command->add_option("--prompt", f.text.prompt,
                        "The prompt (encoded by the folder's text_encoder/ + tokenizer/: umT5, or the shipped tiny model's own)");
    command->add_option("--negative-prompt", f.text.negative_prompt, "The negative prompt for CFG (default: the empty prompt)");
    command->add_option("--max-sequence-length", f.text.max_sequence_length, "umT5 tokens the prompt is padded to (default 512)")
        ->check(in_range(1, 4096))
        ->each([text = &f.text](const std::string&) { text->max_sequence_length_given = true; });
    command->add_option("--prompt-embeds", f.text.prompt_embeds,
                        "safetensors with prompt_embeds [1,L,text_dim] (and negative_prompt_embeds for CFG)");
    command
        ->add_option("--frames", f.frames,
                     "Frames, 1 + 4k, the 1 + k latent frames a multiple of the transformer's temporal patch (default 81, or the model "
                     "folder's generation_defaults.json)")
        ->check(in_range(int64_t{1}, int64_t{4097}));
    command
        ->add_option("--width", f.width,
                     "Width in pixels, a multiple of 8 x the patch size, 16 for Wan2.1 (default 832, or generation_defaults.json's)")
        ->check(in_range(int64_t{16}, int64_t{8192}));
    command
        ->add_option("--height", f.height,
                     "Height in pixels, a multiple of 8 x the patch size, 16 for Wan2.1 (default 480, or generation_defaults.json's)")
        ->check(in_range(int64_t{16}, int64_t{8192}));
    command->add_option("--steps", f.steps, "Denoising steps (default 50, or generation_defaults.json's)")->check(in_range(1, 1000));
    command->add_option("--guidance", f.guidance, "CFG scale: v = v_u + g (v_c - v_u) (default 5, or generation_defaults.json's)")
        ->check(in_range(0.0, 100.0));
    command
        ->add_option("--guidance-2", f.guidance_2,
                     "Two experts (Wan2.2 A14B): the low-noise expert's CFG scale (diffusers' guidance_scale_2; default --guidance)")
        ->check(in_range(0.0, 100.0));
    command->add_option("--cfg", f.cfg, "CFG: fused (one batch of 2, default), streams (two overlapping streams) or off");
    command->add_option("--seed", f.seed, "Noise seed");
    command->add_option("--image", f.image,
                        "Image-to-video: the first frame (PNG or JPEG), resized to the output size (WanImageToVideoPipeline folders)");
    command->add_option("--last-image", f.last_image,
                        "First-last-frame: the last frame (PNG or JPEG), with --image as the first (a checkpoint trained for it)");
    command->add_option("--out", f.out, "Output MJPEG AVI file")->check(output_file_path());
    command->add_option("--frames-dir", f.frames_dir, "Also write each frame, lossless, as DIR/frame_NNNNN.png")
        ->check(CLI::Validator(
            [](const std::string& dir) { return dir.empty() ? std::string("an empty path (a folder is expected)") : std::string(); },
            "DIR"));
    command->add_option("--fps", f.fps, "Frame rate of the AVI (default 16, Wan2.1's)")->check(in_range(1, 240));
    command->add_option("--quality", f.quality, "JPEG quality of the frames (default 90)")->check(in_range(1, 100));
  }
  add_generation_flags(*command, f.common);
  auto parallel_flags = add_parallel_flags(*command, /*cfg_parallel=*/true);
  return [flags, command, device_flags, cache, stage_flags, parallel_flags] {
    return run(*flags, *command, *device_flags, *cache, *stage_flags, *parallel_flags);
  };
}

}  // namespace

CommandRunner add_t2i_command(CLI::App& app) { return add_generate_command(app, Task::t2i); }
CommandRunner add_t2v_command(CLI::App& app) { return add_generate_command(app, Task::t2v); }

}  // namespace cubevec::cli
