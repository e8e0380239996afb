// A model family (Flux text-to-image, Wan text-to-video) as the generation library sees it: one
// interface, so the library (pipelines/pipeline.h), the command line and every later front end run
// any family the same way. What a family knows lives in its own file beside its pipeline
// (flux_family.cpp, wan_family.cpp): its defaults, its text conditioning, its request checks, its
// memory estimate, its block list for offload, its denoise and decode. A new family is its model
// files, its pipeline, one such file and one line in model_family.cpp's registry
// (docs/architecture.md has the checklist).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/device.h"
#include "models/parameters.h"
#include "models/tensor_parallel_plan.h"
#include "parallel/communicator.h"
#include "pipelines/generation.h"
#include "pipelines/memory_estimate.h"
#include "pipelines/request.h"
#include "pipelines/text_conditioning.h"

namespace cubevec::pipelines {

// How a run executes (not what it makes): the activations' dtype and the multi-device groups.
struct RunContext {
  DType activations = DType::f32;
  // CFG parallel: each branch on one of this group's 2 ranks (pipelines/guidance.h).
  std::optional<parallel::Communicator> cfg_parallel;
  // Patch-parallel VAE: the group's ranks share the decode (pipelines/patch_parallel_vae.h).
  std::optional<parallel::Communicator> vae_parallel;
};

// Receives the decoded output in order: an image [1, 3, H, W], or a video's frames a chunk at a
// time [1, 3, f, H, W]; f32 in about [-1, 1].
using DecodedSink = std::function<void(const Tensor& pixels)>;

class ModelPipeline {
 public:
  virtual ~ModelPipeline() = default;

  virtual std::string family() const = 0;  // "flux", "wan"
  virtual std::string task() const = 0;    // "t2i", "t2v": the command and the report's label
  virtual bool video() const = 0;
  // Whether a picture given to this model is a reference it edits (FLUX.1 Kontext) rather than a
  // starting point (image-to-image): no strength applies.
  virtual bool edits_pictures() const { return false; }

  // The weights from `model_dir` replace the shape-only ones the pipeline was made with.
  virtual void load_weights(const std::string& model_dir, DType dtype, const std::string& variant) = 0;

  // `request` with every unset field at this model's default; `from_defaults` gets the flags whose
  // value came from the folder's generation_defaults.json (so an error about it names the file).
  virtual Request with_defaults(const Request& request, const std::string& model_dir, std::vector<std::string>& from_defaults) const = 0;
  // The request's CFG mode (its "cfg", else the family's default).
  virtual CfgMode cfg_mode(const Request& request) const = 0;
  virtual TextInput text_input() const = 0;
  // One-shot text conditioning (pipelines/text_conditioning.h) for this family.
  virtual TextConditioning one_shot_text(const std::string& model_dir, const Request& request, const TextSettings& settings, bool simulate,
                                         const Stream& stream) const = 0;
  // Throws for a request (defaults applied) this model cannot run, naming the setting.
  virtual void check(const Request& request, const RunContext& run, bool have_negative) const = 0;
  virtual MemoryEstimate estimate_memory(const Request& request, const RunContext& run, int64_t text_tokens, int offload,
                                         int cube_threads) const = 0;

  // What the stages need to know of the transformer.
  virtual int blocks() const = 0;
  virtual int64_t attention_heads() const = 0;
  virtual std::vector<std::string> block_modules() const = 0;  // offload's list, flat block order
  virtual models::TensorParallelPlan tensor_parallel_plan() const = 0;
  virtual models::ParameterTable& transformer_parameters() = 0;
  virtual const models::ParameterTable& transformer_parameters() const = 0;
  virtual const models::ParameterTable* vae_parameters() const = 0;  // null without a VAE
  // A second expert's weights (Wan2.2 A14B's transformer_2), or null with one transformer.
  virtual const models::ParameterTable* second_expert_parameters() const { return nullptr; }
  virtual models::ParameterTable* mutable_second_expert_parameters() { return nullptr; }

  // Seeded noise -> final latents, the stages' plug points in every forward.
  virtual Tensor denoise(const TextConditioning& text, const Request& request, const RunContext& run, Device& device,
                         const StepCallback& on_step, T2ITimings& timings, StageList* stages) const = 0;
  // Latents -> pixels through `sink`.
  virtual void decode(const Tensor& latents, const Request& request, const RunContext& run, Device& device, const DecodedSink& sink,
                      T2ITimings& timings) const = 0;

  // The run's description lines for the log (size, steps, guidance, the transformer, ...), given
  // the dtype's and the device profile's names.
  virtual std::vector<std::string> describe(const Request& request, const RunContext& run, const std::string& dtype,
                                            const DeviceProfile& profile, bool simulate) const = 0;
  // The family's fields of the report, in order ("width", "height", "steps", ...).
  virtual nlohmann::ordered_json report_fields(const Request& request) const = 0;
};

// The registry: the folder's transformer/config.json _class_name picks the family; the pipeline
// is made from the config files alone (shape-only weights) for the checks and the memory estimate
// that come before any weight loads. An unknown class is an error naming it and the known ones.
std::unique_ptr<ModelPipeline> load_model_pipeline_meta(const std::string& model_dir, DType dtype);

// The families, for the registry and the docs: the transformer class each is chosen by.
struct ModelFamilyEntry {
  const char* family;             // "flux"
  const char* transformer_class;  // "FluxTransformer2DModel"
  std::unique_ptr<ModelPipeline> (*load_meta)(const std::string& model_dir, DType dtype);
};
const std::vector<ModelFamilyEntry>& model_families();
const ModelFamilyEntry& model_family(const std::string& name);  // "flux", "wan"; an Error for others

// Each family's file defines its entry (registered in model_family.cpp).
ModelFamilyEntry flux_family();
ModelFamilyEntry wan_family();

}  // namespace cubevec::pipelines
