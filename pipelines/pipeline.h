// The generation library: a model folder loaded once, then any number of requests.
//
//   auto pipeline = Pipeline::load("assets/tinyflux", LoadOptions{});
//   GenerationResult r = pipeline->generate(Request::parse(R"({"prompt": "a red circle"})"));
//   r.images[0]  // RGB8
//
// load() reads the folder (a diffusers folder with or without model_index.json), finds its family
// through the registry (pipelines/model_family.h), loads the text encoders, the transformer, the
// VAE and the scheduler config, and applies the load-time stages (quantization, the offload plan,
// tensor parallelism) once. The GEMM panels are packed on a weight's first use and kept, and the
// kernel tuners' tables are the process's, so later requests pay neither.
//
// A loaded pipeline is immutable: generate() keeps every per-request state (step caches, TaylorSeer
// history, sparse masks, the timestep policy's step, the noise) in the call, on a device of its
// own (its own Cube / Vector streams), so two threads may call generate() on one pipeline at once
// and get the pixels of two sequential calls. Text encoding (one set of encoders) and, with
// offload, the denoising (one set of streamed blocks) take turns.
//
// The one-shot command line uses the same steps through PipelinePlan, in the order that keeps its
// peak low: configs, request checks and the memory estimate before any weight loads, and the text
// encoders loaded for the one prompt and freed before the transformer loads.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/device.h"
#include "parallel/plan.h"
#include "media/jpeg.h"
#include "models/packed_cache.h"
#include "pipelines/model_family.h"
#include "models/lora.h"
#include "models/lora_runtime.h"
#include "pipelines/request.h"
#include "pipelines/run_report.h"
#include "pipelines/stage_plan.h"
#include "base/error.h"

namespace cubevec::pipelines {

// How a model loads (what every request then shares). JSON keys as the fields.
struct LoadOptions {
  DType dtype = DType::f32;                  // "dtype": "f32" | "bf16": weights and activations (f32 accumulation)
  std::string variant;                       // diffusion_pytorch_model.<variant>.safetensors
  bool check_weights = false;                // every loaded weight must be finite
  std::string memory_limit;                  // refuse what would not fit ("24G"); empty: the memory available
  std::string quant, timestep_policy;        // MindIE SD quantization description (and its policy)
  std::string quant_2;                       // two experts: transformer_2/'s description (transformer/'s is quant)
  int offload = 0;                           // resident blocks under weight streaming (0: every weight resident)
  int cube_threads = 0, vector_threads = 0;  // 0: the profile's (or CUBEVEC_*_THREADS)
  std::string device_profile;                // a device profile JSON; empty: the built-in cpu-default
  std::string packed_cache;                  // a folder: the packed GEMM panels mapped from a file there (models/packed_cache.h)
  std::vector<std::string> lora;             // "FILE" or "FILE:SCALE": LoRAs fused into the transformer, in order (models/lora.h)
  bool lora_ignore_unmatched = false;        // skip (and count) a LoRA's layers the model lacks
  // "fused" (into the weights at load, as diffusers' fuse_lora) or "runtime" (models/lora_runtime.h:
  // beside each layer, the weights untouched); empty: fused, or runtime with a quantization (its
  // int8 layers come from their own files, so a fused LoRA would not reach them).
  std::string lora_mode;

  // Set by the command line only:
  bool simulate = false;                           // shape-only weights on the profile's modelled clock
  int simulate_quant_steps = 1;                    // simulate with W8A8_TIMESTEP: rows of shape-only scales
  bool trace = false;                              // keep a record per kernel launch (Chrome trace)
  std::optional<parallel::ParallelGroups> groups;  // multi-device (mpirun); none: one process
  std::optional<parallel::Communicator> cfg_parallel, vae_parallel;
  std::optional<DeviceProfile> profile;  // beats device_profile and the thread counts

  // {"dtype", "variant", "check_weights", "memory_limit", "quant", "quant_2", "timestep_policy", "offload",
  //  "cube_threads", "vector_threads", "device_profile", "packed_cache", "lora" (a list),
  //  "lora_ignore_unmatched", "lora_mode"}: unknown keys, wrong types and
  // out-of-range values are errors naming the key.
  static LoadOptions from_json(const nlohmann::json& json, const std::string& source = "options");
  static LoadOptions parse(const std::string& json_text, const std::string& source = "options");
  DeviceProfile resolved_profile() const;
};

// A request stopped by its caller (the cancel flag, or a progress callback asking to stop).
class Cancelled : public Error {
 public:
  Cancelled() : Error("the generation was cancelled") {}
};

struct Progress {
  int step = 0, steps = 0;              // step just finished, 1-based
  double seconds = 0;                   // that step's wall time
  const T2ITimings* timings = nullptr;  // so far
  const StageList* stages = nullptr;    // the request's stages (their per-step counts)
};

// Everything optional; the command line uses all of them.
struct GenerateHooks {
  std::function<void(const Progress&)> on_step;  // after each denoising step
  const std::atomic<bool>* cancel = nullptr;     // checked before each step and before decoding
  // Decoded pixels go here as they come (a video's frames a chunk at a time) instead of into the
  // result's images: a long video then never sits in memory whole.
  DecodedSink on_pixels;
  Device* device = nullptr;                // run on this device (else one made for the call)
  const TextConditioning* text = nullptr;  // already encoded (the one-shot order)
};

struct GenerationResult {
  Request request;                      // with the model's defaults filled in
  std::vector<media::RgbImage> images;  // the image, or the video's frames in order (empty with on_pixels)
  T2ITimings timings;                   // denoising and VAE decode
  double text_s = 0;                    // text encoding
  std::string text_source;
  StageList stages;  // what each acceleration stage did
  MemoryEstimate memory;
  AllocatorStats allocator;  // peaks over the whole call
  nlohmann::ordered_json phase_peaks;
  double denoising_flops = 0;     // the kernels' declared FLOPs while denoising
  bool decoded = false;           // false in simulate mode and on ranks that do not decode
  nlohmann::ordered_json lora;    // the LoRAs applied (null: none)
  nlohmann::ordered_json report;  // all of the above as JSON (the model's fields first)
};

class Pipeline {
 public:
  static std::unique_ptr<Pipeline> load(const std::string& model_dir, const LoadOptions& options = {});
  ~Pipeline();

  GenerationResult generate(const Request& request, const GenerateHooks& hooks = {}) const;
  // The request with the model's defaults, checked against the model and its stages as generate()
  // checks it before any work: a server refuses a bad request before queueing it. Throws Error.
  Request checked(const Request& request) const;
  // The text conditioning generate() would make for `request` (a checked one), for a caller that
  // must know the prompt encodes before it commits to the run (a multi-rank server); pass it back
  // as GenerateHooks::text.
  TextConditioning encode_prompt(const Request& request, const Device& device) const;

  const ModelPipeline& model() const { return *model_; }
  const std::string& model_dir() const { return model_dir_; }
  const LoadOptions& options() const { return options_; }
  const DeviceProfile& profile() const { return profile_; }
  double load_seconds() const { return load_s_; }
  // What the packed cache did at load (nullopt without LoadOptions::packed_cache).
  const std::optional<models::PackedCacheResult>& packed_cache() const { return packed_cache_; }

 private:
  friend class PipelinePlan;
  Pipeline() = default;
  TextConditioning encode_text(const Request& request, bool cfg, const Stream& stream) const;

  std::string model_dir_;
  LoadOptions options_;
  DeviceProfile profile_;
  parallel::ParallelGroups groups_ = parallel::make_simulated_groups({}, 1);  // one process
  std::unique_ptr<ModelPipeline> model_;
  LoadStages stages_;
  double load_s_ = 0;
  std::optional<models::PackedCacheResult> packed_cache_;
  // LoRA at run time: the load options' (lora_mode runtime), and each request's own on top.
  models::RuntimeLora load_lora_;
  std::string lora_summary_;  // what the load-time LoRAs did, for the report
  std::shared_ptr<const models::LoraAdapter> lora_file(const std::string& path) const;
  // The request's own LoRAs resolved on the transformer (none in simulate mode).
  std::vector<std::vector<models::LoraDelta>> request_deltas(const Request& request) const;
  mutable std::mutex lora_files_mutex_;
  mutable std::map<std::string, std::shared_ptr<const models::LoraAdapter>> lora_files_;  // read once per path, size and time
  // The text encoders run on a device of the pipeline's, one request at a time.
  std::unique_ptr<Device> text_device_;
  std::unique_ptr<TextEncoders> text_encoders_;
  mutable std::mutex text_mutex_;
  mutable std::mutex offload_mutex_;
};

// The report of one generation as JSON: the model's fields, the load options', `times` (the
// stages' wall times, in order), the acceleration stages, the memory estimate and the peaks.
nlohmann::ordered_json generation_report(const Pipeline& pipeline, const GenerationResult& result, const std::vector<StageTime>& times,
                                         const Device& device);

// A folder's configs read and nothing loaded: the one-shot path's first half.
class PipelinePlan {
 public:
  // Reads the configs (the family from the registry, or `family` when not empty: "flux", "wan")
  // and the quantization files, so bad ones fail before anything loads. `first_request`: the
  // request a simulated run is for (its steps size the shape-only W8A8_TIMESTEP scales).
  static PipelinePlan read(const std::string& model_dir, const LoadOptions& options, const std::string& family = "",
                           const Request* first_request = nullptr);

  const ModelPipeline& model() const { return *model_; }
  // The request with the model's defaults.
  Request with_defaults(const Request& request);
  // Text conditioning for this one request (encoders loaded and freed here).
  TextConditioning encode_text(const Request& request, const Stream& stream) const;
  // The request against the model and the run (errors name the setting, or the defaults file
  // that set it); then its memory estimate, refused when it cannot fit.
  void check(const Request& request, bool have_negative) const;
  MemoryEstimate require_memory(const Request& request, int64_t text_tokens) const;
  // The weights and the load-time stages: the pipeline, ready for requests.
  std::unique_ptr<Pipeline> load() &&;

 private:
  // The tables a packed cache covers (the transformer's and the VAE's) and what names the file.
  models::PackedCacheModel packed_cache_model() const;
  std::string model_dir_;
  LoadOptions options_;
  DeviceProfile profile_;
  parallel::ParallelGroups groups_ = parallel::make_simulated_groups({}, 1);  // one process
  std::unique_ptr<ModelPipeline> model_;
  std::vector<std::pair<models::LoraAdapter, double>> loras_;  // read before any weight loads
  LoadStages stages_;
  std::vector<std::string> from_defaults_;
};

}  // namespace cubevec::pipelines
