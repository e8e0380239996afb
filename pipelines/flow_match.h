// diffusers' FlowMatchEulerDiscreteScheduler (docs/models.md, "FlowMatch Euler scheduler"), with
// its arithmetic reproduced step for step (float64 where diffusers' numpy code is float64,
// float32 where it is float32) so sigmas and timesteps match diffusers' to the last bit, and
// Flux's `calculate_shift` (mu from the image sequence length).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipelines/scheduler.h"
#include "tensor/tensor.h"
#include "device/stream.h"

namespace cubevec::pipelines {

struct FlowMatchConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;
  bool use_dynamic_shifting = false;
  double base_shift = 0.5, max_shift = 1.15;
  int64_t base_image_seq_len = 256, max_image_seq_len = 4096;
  std::string time_shift_type = "exponential";  // or "linear"

  // From a diffusers scheduler/scheduler_config.json. Options this port does not implement
  // (Karras / exponential / beta sigmas, shift_terminal, invert_sigmas, stochastic sampling) are
  // errors when enabled; unknown keys are ignored as diffusers ignores them.
  static FlowMatchConfig from_json(const nlohmann::json& json, const std::string& source);
  static FlowMatchConfig load(const std::string& path);
};

// Flux's mu: linear in the image sequence length between (base_image_seq_len, base_shift) and
// (max_image_seq_len, max_shift).
double flux_mu(const FlowMatchConfig& config, int64_t image_seq_len);

class FlowMatchEulerScheduler : public Scheduler {
 public:
  explicit FlowMatchEulerScheduler(FlowMatchConfig config);

  std::string name() const override;  // "FlowMatch Euler (shift 3, dynamic)"

  const FlowMatchConfig& config() const { return config_; }

  // diffusers' set_timesteps(N): sigmas spaced linearly between the trained sigma_max and
  // sigma_min (already shifted; the shift is applied again, as diffusers does). mu is required
  // with dynamic shifting and ignored otherwise.
  void set_timesteps(int steps, std::optional<double> mu = std::nullopt);
  // set_timesteps(sigmas=...): the given sigmas (cast to float32), shifted; Flux passes
  // linspace(1, 1/N, N).
  void set_sigmas(const std::vector<double>& sigmas, std::optional<double> mu = std::nullopt);
  // Flux's schedule for `steps` steps at this image sequence length.
  void set_flux_timesteps(int steps, int64_t image_seq_len);
  // Image-to-image: the schedule from step `index` on (diffusers' timesteps[t_start:] with
  // set_begin_index): steps() becomes the rest.
  void begin_at(int index);

  const std::vector<float>& sigmas() const override { return sigmas_; }        // steps + 1, ending at 0
  const std::vector<float>& timesteps() const override { return timesteps_; }  // steps: sigma * 1000
  int step_index() const { return step_index_; }

  // Euler: x + (sigma[i+1] - sigma[i]) * v (f32), then the step index moves on. A bf16 v is
  // stepped as diffusers' bf16 run does it: the product dt * v is rounded to bf16 before the f32
  // add. Throws past the last step or on mismatched shapes.
  Tensor step(const Tensor& v, const Tensor& x, const Stream& stream) override;

 private:
  // Shifts float32 sigmas (in float32, unless already shifted), appends the final 0, derives the timesteps.
  void finish(std::vector<float> sigmas, std::optional<double> mu, bool already_shifted = false);

  FlowMatchConfig config_;
  float sigma_min_ = 0, sigma_max_ = 1;
  std::vector<float> sigmas_, timesteps_;
  int step_index_ = 0;
  bool begun_ = false;  // begin_at cut the schedule
};

}  // namespace cubevec::pipelines
