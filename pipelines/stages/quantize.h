// MindIE SD's quantize(model, description) as a stage: after load, every Linear the description
// quantizes gets its scheme (quant/schemes.h) as the Linear's kernel, through the layer registry.
// Everything is read and checked before anything is swapped (nothing is half-applied); the float
// weights of swapped layers are released. The denoising step reaches timestep-aware layers from
// the step context (before_step: the calling thread's step, so requests sharing the layers on
// different threads each quantize at their own step).
//   --quant quant_model_description_w8a8_dynamic.json [--timestep-policy POLICY.json]
// A two-expert model (Wan2.2 A14B) takes one description per expert, as msModelSlim quantizes each
// transformer on its own: --quant for transformer/, --quant-2 for transformer_2/ (cubevec quantize
// writes the second into its --out folder's transformer_2/).
// In simulate mode --quant may name an algorithm instead of a file ("W8A8_DYNAMIC"): every Linear
// of the transformer blocks then gets shape-only int8 weights of that scheme, so the NPU's int8
// rate prices them.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "pipelines/stage.h"
#include "quant/files.h"
#include "quant/schemes.h"

namespace cubevec::pipelines {

struct QuantizeOptions {
  std::string description;      // a description file, or (simulate) an algorithm name
  std::string timestep_policy;  // a policy file, or empty (every step dynamic, as MindIE's default)
  bool simulate = false;
  int simulate_steps = 1;       // simulate with W8A8_TIMESTEP: rows of shape-only static scales
  std::string description_2{};  // the second expert's (transformer_2/) description file, or empty
};

class QuantizeStage : public Stage {
 public:
  // Reads the description and the policy now, so a bad file fails before the model loads.
  explicit QuantizeStage(QuantizeOptions options);
  std::string name() const override;  // "quantize W8A8_DYNAMIC"
  void after_load(models::ParameterTable& parameters) override;
  void after_load_second_model(models::ParameterTable& parameters) override;
  // Checks that every step the policy makes static has its row of scales in every
  // W8A8_TIMESTEP layer before the first step runs.
  void begin_run(const RunInfo& run) override;
  void before_step(const models::StepInfo& step) override;
  void set_step(int step);  // for one forward outside a loop (cubevec forward --step-index); checked as begin_run
  std::string summary() const override;
  nlohmann::ordered_json report() const override;

  int layers() const { return static_cast<int>(swapped_.size()); }
  std::size_t int8_weight_bytes() const { return quantized_bytes_; }
  std::size_t float_weight_bytes() const { return float_bytes_; }

 private:
  QuantizeOptions options_;
  std::optional<quant::Description> description_, description_2_;
  std::optional<quant::Algorithm> meta_algorithm_;  // simulate with an algorithm name
  std::shared_ptr<const quant::TimestepPolicy> policy_;
  void check_static_rows(int first, int count) const;
  // Swaps `table`'s layers as `description` says (null: the simulate algorithm); `model` prefixes
  // its module names in the report ("" or "transformer_2/").
  void quantize(models::ParameterTable& table, const quant::Description* description, const std::string& model);
  std::map<std::string, std::string> swapped_;  // module -> algorithm
  std::map<std::string, int> static_rows_;      // W8A8_TIMESTEP module -> steps with static scales
  std::size_t quantized_bytes_ = 0, float_bytes_ = 0;
};

// Makes `layer` run `scheme` (its float weight released), at the step the calling thread's
// denoising loop is at (before_step / set_step; 0 before any): what the stage does for each layer,
// for tools that quantize layers themselves (benchmarks).
void install_quantized(models::Linear& layer, std::shared_ptr<const quant::QuantizedLinear> scheme);

}  // namespace cubevec::pipelines
