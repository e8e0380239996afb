#include "pipelines/pipeline.h"

#include <chrono>
#include <filesystem>

#include "pipelines/generation.h"
#include "pipelines/generation_defaults.h"
#include "pipelines/seconds_since.h"
#include "ops/gemm/tuner.h"
#include "ops/gemm/driver.h"
#include "pipelines/stages/offload.h"
#include "pipelines/stages/quantize.h"
#include "tensor/caching_allocator.h"
#include "base/config_reader.h"
#include "base/regular_file.h"
#include "tensor/finite_check.h"
#include "base/strict_json.h"

namespace cubevec::pipelines {

namespace {

parallel::ParallelGroups one_process() { return parallel::make_simulated_groups(parallel::ParallelDegrees{}, 1); }

// The model's check names flags; a value the folder's generation_defaults.json gave is named as
// the file's.
void check_request(const ModelPipeline& model, const Request& request, const RunContext& run, bool have_negative,
                   const std::vector<std::string>& from_defaults, const std::string& model_dir) {
  try {
    model.check(request, run, have_negative);
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& flag : from_defaults)
      if (message.rfind(flag + " ", 0) == 0) throw Error(GenerationDefaults::path(model_dir) + " sets " + flag + ": " + message);
    throw;
  }
}

// The pipeline whose streamed blocks this thread holds (a progress callback calling generate() on
// the same pipeline would wait for itself).
thread_local const Pipeline* t_offloading = nullptr;

RunContext run_context(const LoadOptions& options) { return {options.dtype, options.cfg_parallel, options.vae_parallel}; }

TextSettings text_settings(const LoadOptions& options) {
  return {options.dtype, options.check_weights && !options.simulate, options.memory_limit};
}

// The decoded pixels as RGB8 images: one for an image [1, 3, H, W], one per frame of [1, 3, f, H, W].
void append_rgb(const Tensor& pixels, std::vector<media::RgbImage>& images) {
  if (pixels.dim() == 4) {
    images.push_back(media::to_rgb(pixels));
    return;
  }
  for (int64_t i = 0; i < pixels.size(2); ++i) images.push_back(media::to_rgb(pixels.select(2, i)));
}

}  // namespace

// --- LoadOptions -------------------------------------------------------------------------------

LoadOptions LoadOptions::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "load options");
  LoadOptions o;
  std::string dtype = "f32";
  r.text("dtype", dtype, {"f32", "bf16"})
      .text("variant", o.variant)
      .boolean("check_weights", o.check_weights)
      .text("memory_limit", o.memory_limit)
      .text("quant", o.quant)
      .text("quant_2", o.quant_2)
      .text("timestep_policy", o.timestep_policy)
      .integer("offload", o.offload, 0, 1 << 20)
      .integer("cube_threads", o.cube_threads, 0, 4096)
      .integer("vector_threads", o.vector_threads, 0, 4096)
      .text("device_profile", o.device_profile)
      .text("packed_cache", o.packed_cache)
      .texts("lora", o.lora)
      .boolean("lora_ignore_unmatched", o.lora_ignore_unmatched)
      .text("lora_mode", o.lora_mode, {"fused", "runtime"});
  r.reject_unknown();
  o.dtype = parse_dtype(dtype);
  if (!o.memory_limit.empty()) {
    try {
      parse_memory_size(o.memory_limit, "");
    } catch (const Error& e) {
      r.fail("memory_limit", std::string("must be a size such as \"24G\": ") + e.what());
    }
  }
  return o;
}

LoadOptions LoadOptions::parse(const std::string& json_text, const std::string& source) {
  nlohmann::json json;
  try {
    json = json_text.empty() ? nlohmann::json::object() : parse_strict_json(json_text, 8);
  } catch (const StrictJsonError& e) {
    throw Error(source + ": " + (e.kind() == StrictJsonError::Kind::Syntax ? "" : "not valid JSON: ") + e.what());
  }
  return from_json(json, source);
}

DeviceProfile LoadOptions::resolved_profile() const {
  if (profile) return *profile;
  DeviceProfile p = device_profile.empty() ? builtin_cpu_profile() : load_device_profile(device_profile);
  apply_thread_overrides(p, cube_threads, vector_threads);
  return p;
}

// --- PipelinePlan ------------------------------------------------------------------------------

PipelinePlan PipelinePlan::read(const std::string& model_dir, const LoadOptions& options, const std::string& family,
                                const Request* first_request) {
  PipelinePlan plan;
  plan.model_dir_ = model_dir;
  plan.options_ = options;
  plan.profile_ = options.resolved_profile();
  plan.groups_ = options.groups ? *options.groups : one_process();
  if (options.quant.empty() && !options.timestep_policy.empty())
    throw Error("--timestep-policy applies with --quant (a W8A8_TIMESTEP description)");
  plan.model_ =
      family.empty() ? load_model_pipeline_meta(model_dir, options.dtype) : model_family(family).load_meta(model_dir, options.dtype);
  // Two experts (Wan2.2 A14B): quantization takes one description per expert, offload streams both,
  // tensor parallel cuts both (the stages' after_load_second_model) and the packed cache holds both.
  if (!options.quant_2.empty() && !plan.model_->second_expert_parameters())
    throw Error("--quant-2 is the second expert's (transformer_2/) quantization; " + model_dir + " has one transformer");
  if (!options.quant_2.empty() && options.quant.empty())
    throw Error("--quant-2 " + options.quant_2 + " needs --quant for transformer/ (the high-noise expert) too");
  // The quantization files are read now, so a bad one fails before any weight loads.
  if (!options.quant.empty()) {
    int simulate_steps = options.simulate_quant_steps;
    if (options.simulate && first_request) {
      std::vector<std::string> unused;
      simulate_steps = *plan.model_->with_defaults(*first_request, model_dir, unused).num_inference_steps;
    }
    plan.stages_.quantize = std::make_unique<QuantizeStage>(
        QuantizeOptions{options.quant, options.timestep_policy, options.simulate, simulate_steps, options.quant_2});
  }
  if (!options.packed_cache.empty() && options.offload > 0)
    throw Error("--packed-cache maps every layer's panels for the whole run; it does not combine with --offload, which streams them");
  if (!options.packed_cache.empty() && options.simulate)
    throw Error("--packed-cache has nothing to map under --simulate (no weight is loaded)");
  if (!options.packed_cache.empty()) folder_exists(options.packed_cache, " (--packed-cache names the folder the packed panels go in)");
  if (options.offload > 0)
    plan.stages_.offload = std::make_unique<OffloadStage>(options.offload, plan.model_->block_modules(), plan.profile_.cube_threads);
  // The LoRA files are read now too: a bad one fails before any weight loads.
  if (!options.lora_mode.empty() && options.lora_mode != "fused" && options.lora_mode != "runtime")
    throw Error("--lora-mode must be fused or runtime, got '" + options.lora_mode + "'");
  if (options.lora_mode == "fused" && !options.quant.empty() && !options.lora.empty())
    throw Error(
        "--lora-mode fused with --quant: the quantized layers load their int8 weights from the quantization's own files, so a "
        "LoRA fused into the float weights would not reach them; use --lora-mode runtime (the default with --quant)");
  if (options.lora_mode == "runtime" && plan.groups_.degrees.tp > 1)
    throw Error("--lora-mode runtime with --tp is not supported: the LoRA's matrices would need their shards too");
  for (const std::string& flag : options.lora) {
    const auto [path, scale] = models::parse_lora_flag(flag);
    plan.loras_.emplace_back(models::read_lora(path), scale);
  }
  return plan;
}

Request PipelinePlan::with_defaults(const Request& request) {
  from_defaults_.clear();
  return model_->with_defaults(request, model_dir_, from_defaults_);
}

TextConditioning PipelinePlan::encode_text(const Request& request, const Stream& stream) const {
  return model_->one_shot_text(model_dir_, request, text_settings(options_), options_.simulate, stream);
}

void PipelinePlan::check(const Request& request, bool have_negative) const {
  check_request(*model_, request, run_context(options_), have_negative, from_defaults_, model_dir_);
  check_heads(groups_, model_->attention_heads());
  // The request's stages against the run (their settings, and what combines with what).
  request_stages(stages_, request, model_->blocks(), sequence_parallel_stage(groups_), options_.simulate);
}

MemoryEstimate PipelinePlan::require_memory(const Request& request, int64_t text_tokens) const {
  const MemoryEstimate estimate =
      model_->estimate_memory(request, run_context(options_), text_tokens, options_.offload, profile_.cube_threads);
  if (!options_.memory_limit.empty()) {
    const uint64_t limit = parse_memory_size(options_.memory_limit, "--memory-limit");
    require_fits(estimate, limit, "--memory-limit " + options_.memory_limit);
    default_allocator().set_memory_limit(limit);
  } else if (!options_.simulate) {
    // A simulated run allocates nothing: only an explicit limit (a device's memory) applies to it.
    require_fits(estimate, available_memory_bytes(), "the memory available now (give --memory-limit to set another)");
  }
  return estimate;
}

models::PackedCacheModel PipelinePlan::packed_cache_model() const {
  models::PackedCacheModel m;
  std::error_code error;
  const std::filesystem::path folder = std::filesystem::weakly_canonical(model_dir_, error);
  m.name = (error ? std::filesystem::path(model_dir_) : folder).filename().string();
  if (m.name.empty()) m.name = "model";
  // Loads of one folder that pack differently get files of their own instead of replacing each
  // other's: the dtype, variant and quantization are part of the name's hash.
  m.identity = (error ? model_dir_ : folder.string()) + '\n' + std::string(dtype_name(options_.dtype)) + '\n' + options_.variant + '\n' +
               options_.quant + '\n' + options_.quant_2 + '\n' + options_.timestep_policy;
  for (const std::string& lora : options_.lora) m.identity += "\nlora " + lora;
  m.tables.emplace_back("transformer", &model_->transformer_parameters());
  if (const models::ParameterTable* second = model_->second_expert_parameters()) m.tables.emplace_back("transformer_2", second);
  if (const models::ParameterTable* vae = model_->vae_parameters()) m.tables.emplace_back("vae", vae);
  m.threads = profile_.cube_threads;
  return m;
}

std::unique_ptr<Pipeline> PipelinePlan::load() && {
  const auto t0 = std::chrono::steady_clock::now();
  if (!options_.simulate) {
    model_->load_weights(model_dir_, options_.dtype, options_.variant);
    if (options_.check_weights) {
      models::require_finite_parameters(model_->transformer_parameters(), model_dir_ + "/transformer");
      if (const models::ParameterTable* second = model_->second_expert_parameters())
        models::require_finite_parameters(*second, model_dir_ + "/transformer_2");
      if (const models::ParameterTable* vae = model_->vae_parameters()) models::require_finite_parameters(*vae, model_dir_ + "/vae");
    }
  }
  // LoRAs fused into the weights (diffusers' fuse_lora) before anything shards, quantizes or packs
  // them; or, at run time, resolved after the quantization (its layers stay int8).
  const bool runtime_lora = options_.lora_mode == "runtime" || (options_.lora_mode.empty() && !options_.quant.empty());
  if (!options_.simulate && !runtime_lora)
    for (const auto& [adapter, scale] : loras_) {
      int unmatched = 0;
      const int fused = models::fuse_lora(model_->transformer_parameters(), adapter, scale, options_.lora_ignore_unmatched, &unmatched);
      if (unmatched)
        print_notice_once("--lora " + adapter.path + ": " + std::to_string(unmatched) +
                          " of its layers match none of the model's (skipped; " + std::to_string(fused) + " fused)");
    }
  stages_.tensor_parallel = tensor_parallel_stage(groups_, model_->tensor_parallel_plan());
  stages_.after_load(model_->transformer_parameters());
  if (models::ParameterTable* second = model_->mutable_second_expert_parameters()) stages_.after_load_second_model(*second);
  std::unique_ptr<Pipeline> p(new Pipeline());
  if (!options_.simulate && runtime_lora)
    for (const auto& [adapter, scale] : loras_) {
      int unmatched = 0;
      const std::vector<models::LoraDelta> deltas =
          models::resolve_lora(model_->transformer_parameters(), adapter, scale, options_.lora_ignore_unmatched, &unmatched);
      p->load_lora_.add(deltas);
      if (unmatched)
        print_notice_once("--lora " + adapter.path + ": " + std::to_string(unmatched) +
                          " of its layers match none of the model's (skipped; " + std::to_string(deltas.size()) + " applied at run time)");
    }
  if (!loras_.empty()) p->lora_summary_ = runtime_lora ? "runtime" : "fused";
  if (!loras_.empty() && model_->second_expert_parameters())
    print_notice_once("--lora applies to transformer/ (the high-noise expert) only, as diffusers' load_lora_weights does by default");
  if (!options_.packed_cache.empty()) p->packed_cache_ = models::use_packed_cache(options_.packed_cache, packed_cache_model());
  p->model_dir_ = model_dir_;
  p->options_ = options_;
  p->profile_ = profile_;
  p->groups_ = groups_;
  p->model_ = std::move(model_);
  p->stages_ = std::move(stages_);
  p->load_s_ = seconds_since(t0);
  return p;
}

// --- Pipeline ----------------------------------------------------------------------------------

std::unique_ptr<Pipeline> Pipeline::load(const std::string& model_dir, const LoadOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  ops::gemm::check_kernel_environment();  // a bad CUBEVEC_* kernel variable fails the load, not the first request
  PipelinePlan plan = PipelinePlan::read(model_dir, options);
  std::unique_ptr<Pipeline> p = std::move(plan).load();
  if (!options.simulate) {
    p->text_device_ = std::make_unique<Device>(p->profile_);
    p->text_encoders_ =
        TextEncoders::load(model_dir, p->model_->text_input(), text_settings(options), 512, p->text_device_->default_stream());
  }
  p->load_s_ = seconds_since(t0);
  return p;
}

Pipeline::~Pipeline() = default;

TextConditioning Pipeline::encode_text(const Request& request, bool cfg, const Stream& stream) const {
  if (!text_encoders_) return model_->one_shot_text(model_dir_, request, text_settings(options_), options_.simulate, stream);
  std::lock_guard lock(text_mutex_);
  TextConditioning text = text_encoders_->encode(request.text, cfg);
  text_device_->synchronize();
  return text;
}

TextConditioning Pipeline::encode_prompt(const Request& request, const Device& device) const {
  return encode_text(request, model_->cfg_mode(request) != CfgMode::off, device.default_stream());
}

std::shared_ptr<const models::LoraAdapter> Pipeline::lora_file(const std::string& path) const {
  // Read once per file as it is now (its size and time): a request names its LoRA every time.
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  const auto time = error ? std::filesystem::file_time_type{} : std::filesystem::last_write_time(path, error);
  const std::string key = path + '\n' + std::to_string(error ? 0 : size) + '\n' + std::to_string(time.time_since_epoch().count());
  std::lock_guard lock(lora_files_mutex_);
  if (const auto it = lora_files_.find(key); it != lora_files_.end()) return it->second;
  auto adapter = std::make_shared<const models::LoraAdapter>(models::read_lora(path));
  if (lora_files_.size() >= 16) lora_files_.erase(lora_files_.begin());  // a few resident adapters, not every file ever named
  lora_files_[key] = adapter;
  return adapter;
}

std::vector<std::vector<models::LoraDelta>> Pipeline::request_deltas(const Request& request) const {
  std::vector<std::vector<models::LoraDelta>> deltas;
  if (request.lora.empty() || options_.simulate) return deltas;
  if (groups_.degrees.tp > 1)
    throw Error("'lora' in a request with --tp is not supported: the LoRA's matrices would need their shards too");
  for (const std::string& flag : request.lora) {
    const auto [path, scale] = models::parse_lora_flag(flag);
    deltas.push_back(models::resolve_lora(model_->transformer_parameters(), *lora_file(path), scale, options_.lora_ignore_unmatched));
  }
  return deltas;
}

Request Pipeline::checked(const Request& request) const {
  std::vector<std::string> from_defaults;
  Request r = model_->with_defaults(request, model_dir_, from_defaults);
  (void)request_deltas(r);  // the files read and matched against the model before the request queues
  check_request(*model_, r, run_context(options_), /*have_negative=*/true, from_defaults, model_dir_);
  check_heads(groups_, model_->attention_heads());
  (void)request_stages(stages_, r, model_->blocks(), sequence_parallel_stage(groups_), options_.simulate);
  return r;
}

GenerationResult Pipeline::generate(const Request& request, const GenerateHooks& hooks) const {
  const auto cancelled = [&] { return hooks.cancel && hooks.cancel->load(); };
  if (cancelled()) throw Cancelled();
  GenerationResult result;
  std::vector<std::string> from_defaults;
  result.request = model_->with_defaults(request, model_dir_, from_defaults);
  const Request& r = result.request;
  const RunContext run = run_context(options_);
  const bool cfg = model_->cfg_mode(r) != CfgMode::off;
  std::optional<Device> own_device;
  Device& device = hooks.device ? *hooks.device : own_device.emplace(profile_, DeviceOptions{options_.simulate, options_.trace});

  // The request's own settings first (size, steps, stages), before the text encoders run.
  check_request(*model_, r, run, /*have_negative=*/true, from_defaults, model_dir_);
  result.stages = request_stages(stages_, r, model_->blocks(), sequence_parallel_stage(groups_), options_.simulate);
  auto t0 = std::chrono::steady_clock::now();
  const TextConditioning text = hooks.text ? *hooks.text : encode_text(r, cfg, device.default_stream());
  result.text_s = seconds_since(t0);
  result.text_source = text.source;
  check_request(*model_, r, run, text.negative.has_value(), from_defaults, model_dir_);
  check_heads(groups_, model_->attention_heads());
  result.memory = model_->estimate_memory(r, run, text.positive.sequence.size(1), options_.offload, profile_.cube_threads);
  if (!hooks.text && !options_.simulate) {
    // The weights are in memory already: what must still fit is the request's own working set.
    const uint64_t working = std::max(result.memory.denoising, result.memory.vae_decode);
    if (!options_.memory_limit.empty()) {
      require_fits(result.memory, parse_memory_size(options_.memory_limit, "--memory-limit"), "--memory-limit " + options_.memory_limit);
    } else if (const uint64_t available = available_memory_bytes(); available > 0 && working > available) {
      throw Error("this request needs about " + human_bytes(working) + " for its activations, more than the " + human_bytes(available) +
                  " available now");
    }
  }

  // One set of streamed blocks: with offload, requests denoise one at a time.
  std::unique_lock offload_lock(offload_mutex_, std::defer_lock);
  if (stages_.offload) {
    if (t_offloading == this)
      throw Error(
          "generate() was called from inside a request of the same pipeline, which streams its weights (offload): its blocks "
          "are in use until that request returns; call it from another thread, or after the request");
    offload_lock.lock();
  }
  struct Holding {
    const Pipeline* previous;
    ~Holding() { t_offloading = previous; }
  } holding{t_offloading};
  if (stages_.offload) t_offloading = this;
  if (cancelled()) throw Cancelled();
  const double flops_before = declared_flops(device);
  const StepCallback on_step = [&](int step, int steps, double seconds) {
    if (hooks.on_step) hooks.on_step({step, steps, seconds, &result.timings, &result.stages});
    if (cancelled()) throw Cancelled();
  };
  // The LoRAs at run time: the load's and the request's own, on this thread only.
  models::RuntimeLora lora = load_lora_;
  for (const std::vector<models::LoraDelta>& deltas : request_deltas(r)) lora.add(deltas);
  if (!lora_summary_.empty() || !r.lora.empty())
    result.lora = {{"mode", lora_summary_.empty() ? "runtime" : lora_summary_},
                   {"load", options_.lora},
                   {"request", r.lora},
                   {"runtime_layers", lora.layers()},
                   {"runtime_rank", lora.total_rank()}};
  const models::RuntimeLoraScope lora_scope(&lora);
  const Tensor latents = [&] {
    try {
      return model_->denoise(text, r, run, device, on_step, result.timings, &result.stages);
    } catch (const Cancelled&) {
      throw;
    } catch (const Error& e) {
      // Latents gone non-finite with LoRAs applied at run time: say which (a scale or values that overflow).
      const std::string what = e.what();
      if (lora.empty() || what.find("non-finite") == std::string::npos) throw;
      std::vector<std::string> applied = lora_summary_ == "runtime" ? options_.lora : std::vector<std::string>{};
      applied.insert(applied.end(), r.lora.begin(), r.lora.end());
      std::string files;
      for (const std::string& f : applied) files += (files.empty() ? "" : ", ") + f;
      throw Error("--lora " + files + ": with these LoRAs applied at run time, " + what +
                  " (a LoRA's scale or values too large for the activations)");
    }
  }();
  PhasePeaks peaks = PhasePeaks::after_denoising();
  result.denoising_flops = declared_flops(device) - flops_before;
  if (offload_lock.owns_lock()) {
    offload_lock.unlock();
    t_offloading = holding.previous;
  }

  // Rank 0 gets the pixels; with a patch-parallel VAE every rank decodes its share.
  const bool writer = groups_.world.rank() == 0;
  if (!options_.simulate && (writer || run.vae_parallel)) {
    if (cancelled()) throw Cancelled();
    const std::string what = model_->video() ? "the VAE decode gave non-finite frames (a VAE weight or setting gives NaN or inf)"
                                             : "the VAE decode gave a non-finite picture (a VAE weight or setting gives NaN or inf)";
    model_->decode(
        latents, r, run, device,
        [&](const Tensor& pixels) {
          if (!writer) return;
          require_finite(pixels, what);
          if (hooks.on_pixels) hooks.on_pixels(pixels);
          else append_rgb(pixels, result.images);
        },
        result.timings);
    result.decoded = true;
  }
  device.synchronize();
  result.allocator = peaks.finish();
  result.phase_peaks = peaks.json();

  std::vector<StageTime> times{{"load", load_s_}, {"text encoding", result.text_s}};
  if (result.timings.image_s > 0) times.push_back({"image encoding", result.timings.image_s});
  times.push_back({"denoising", result.timings.denoise_s});
  if (result.decoded) times.push_back({"VAE decode", result.timings.vae_s});
  result.report = generation_report(*this, result, times, device);
  return result;
}

nlohmann::ordered_json generation_report(const Pipeline& pipeline, const GenerationResult& result, const std::vector<StageTime>& times,
                                         const Device& device) {
  const LoadOptions& o = pipeline.options();
  nlohmann::ordered_json json = {{"model", pipeline.model_dir()}, {"family", pipeline.model().family()}};
  json.update(pipeline.model().report_fields(result.request));
  json["dtype"] = std::string(dtype_name(o.dtype));
  json["simulate"] = o.simulate;
  json["profile"] = pipeline.profile().name;
  json["cube_threads"] = device.profile().cube_threads;  // this run's device: a server instance's share
  json["vector_threads"] = device.profile().vector_threads;
  json["text"] = result.text_source;
  json.update(timing_json(times, result.timings, result.allocator));
  json["denoising_flops"] = result.denoising_flops;  // the kernels' declared FLOPs (the bench's GFLOP/s)
  json.update(stage_report_json(result.stages));
  if (o.groups && o.groups->world.size() > 1) json["communication"] = communication_json(device);
  json["memory_estimate"] = memory_estimate_json(result.memory);
  json["measured_peak_bytes"] = result.phase_peaks;
  if (pipeline.packed_cache()) json["packed_cache"] = pipeline.packed_cache()->json();
  if (!result.lora.is_null()) json["lora"] = result.lora;
  json["gemm_panels_packed"] = ops::gemm::packed_b_count();  // in this process so far
  return json;
}

}  // namespace cubevec::pipelines
