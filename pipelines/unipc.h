// diffusers' UniPCMultistepScheduler as the diffusers-format Wan2.1 repos ship it
// (scheduler/scheduler_config.json: flow_prediction, use_flow_sigmas, flow_shift, solver_order 2,
// bh2, predict_x0, lower_order_final, final_sigmas_type "zero"): the flow-matching sigma grid
// (docs/models.md, "UniPC's sigma grid") and the multistep UniP predictor / UniC
// corrector. The grid is computed in float64 as diffusers' numpy code does, so sigmas and the
// truncated integer timesteps equal diffusers'; the step works on f32 tensors with float32
// scalar coefficients, as diffusers' torch code does. tests/reference/make_unipc_reference.py
// documents every numerical detail.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/stream.h"
#include "pipelines/scheduler.h"
#include "tensor/tensor.h"

namespace cubevec::pipelines {

struct UniPCConfig {
  int64_t num_train_timesteps = 1000;
  double flow_shift = 1.0;
  int solver_order = 2;  // 1 or 2

  // From a diffusers scheduler/scheduler_config.json with `_class_name` "UniPCMultistepScheduler".
  // Only the flow-matching configuration above is implemented: prediction_type other than
  // "flow_prediction", use_flow_sigmas false, predict_x0 false, solver_type "bh1", thresholding,
  // Karras / exponential / beta sigmas, dynamic shifting, shift_terminal, final_sigmas_type
  // "sigma_min", lower_order_final false, a non-empty disable_corrector, solver_p, variance_type or
  // solver_order above 2 are errors naming `source` and the key. Keys that do not affect this
  // configuration (the beta schedule, timestep_spacing, steps_offset, ...) and unknown keys are
  // ignored, as diffusers ignores them.
  static UniPCConfig from_json(const nlohmann::json& json, const std::string& source);
  static UniPCConfig load(const std::string& path);
};

class UniPCMultistepScheduler : public Scheduler {
 public:
  explicit UniPCMultistepScheduler(UniPCConfig config);

  std::string name() const override;  // "UniPC multistep (order 2, flow shift 3)"

  const UniPCConfig& config() const { return config_; }

  // diffusers' set_timesteps(N) (and set_begin_index(0)): resets the step index and the history.
  void set_timesteps(int steps);

  const std::vector<float>& sigmas() const override { return sigmas_; }  // steps + 1, ending at 0
  // What the model is given: diffusers' int64 timesteps (truncated sigma * 1000), as float.
  const std::vector<float>& timesteps() const override { return timesteps_; }
  int step_index() const { return step_index_; }

  // One multistep UniPC step: the model output (flow velocity, f32) at `sample` (f32, the sample
  // the previous step returned, or the initial noise) to the sample at the next sigma. Corrects
  // `sample` with the previous step's state first (UniC), then predicts (UniP). Throws past the
  // last step or on mismatched shapes / dtypes. A bf16 model output is widened to f32 first.
  Tensor step(const Tensor& model_output, const Tensor& sample, const Stream& stream) override;

 private:
  float lambda(int index) const;  // log(1 - sigma) - log(sigma), float32

  UniPCConfig config_;
  std::vector<float> sigmas_, timesteps_;
  int step_index_ = 0;
  // State between steps: the data predictions x0 of the last solver_order steps (newest last),
  // the sample the last predictor started from and that predictor's order.
  std::vector<Tensor> x0_history_;
  Tensor last_sample_;
  int last_order_ = 0;
};

}  // namespace cubevec::pipelines
