#include "pipelines/unipc.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "ops/vector_ops.h"
#include "base/config_reader.h"
#include "base/error.h"
#include "base/strict_json.h"

namespace cubevec::pipelines {

namespace {

const char* const kClassName = "UniPCMultistepScheduler";

// A one-element f32 tensor, broadcast by ops::mul to scale a whole tensor.
Tensor scalar(float value) { return Tensor::from_vector(std::vector<float>{value}, {1}); }

// The coefficients of a move from sigma_s to sigma_t (both float32, as diffusers' torch scalars):
// ratio = sigma_t / sigma_s, h = lambda_t - lambda_s, phi = expm1(-h) (which is also B(h) for bh2)
// and alpha_phi = (1 - sigma_t) * phi. For sigma_t = 0, lambda_t = +inf: h = inf, phi = -1.
struct Move {
  float ratio, h, phi, alpha_phi;
};

}  // namespace

UniPCConfig UniPCConfig::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, kClassName);
  r.expect_class({kClassName});
  auto unsupported = [&](const std::string& key, const std::string& what) {
    r.fail(key, "is " + what + ", which cubevec's UniPCMultistepScheduler does not implement");
  };
  auto flag = [&](const char* key, bool fallback) {
    r.boolean(key, fallback);
    return fallback;
  };
  UniPCConfig c;
  int64_t order = c.solver_order;
  // Bounds that keep every sigma finite: one training timestep leaves no interval to step over, and
  // a shift beyond 1e4 rounds the sigmas of a float schedule to 1.
  r.integer("num_train_timesteps", c.num_train_timesteps, 2, 1000000)
      .number_in("flow_shift", c.flow_shift, 1e-4, 1e4)
      .integer("solver_order", order, 1);
  if (order > 2) unsupported("solver_order", std::to_string(order) + " (1 and 2 are)");
  c.solver_order = static_cast<int>(order);

  // diffusers' defaults are the epsilon / VP-schedule ones, so these two must be present.
  std::string prediction = "epsilon";
  r.text("prediction_type", prediction);
  if (prediction != "flow_prediction")
    unsupported("prediction_type",
                "\"" + prediction + "\"" + (r.has("prediction_type") ? "" : " (diffusers' default)") + " (only \"flow_prediction\" is)");
  if (!flag("use_flow_sigmas", false)) unsupported("use_flow_sigmas", r.has("use_flow_sigmas") ? "false" : "false (diffusers' default)");

  if (!flag("predict_x0", true)) unsupported("predict_x0", "false");
  std::string solver = "bh2";
  r.text("solver_type", solver);
  // diffusers maps the DPM-Solver names onto bh2.
  if (solver != "bh2" && solver != "midpoint" && solver != "heun" && solver != "logrho")
    unsupported("solver_type", "\"" + solver + "\" (only \"bh2\" is)");
  if (!flag("lower_order_final", true))
    unsupported("lower_order_final", "false (with final_sigmas_type \"zero\" diffusers' last step is then not finite)");
  std::string final_sigmas = "zero";
  r.text("final_sigmas_type", final_sigmas);
  if (final_sigmas != "zero") unsupported("final_sigmas_type", "\"" + final_sigmas + "\" (only \"zero\" is)");
  for (const char* key : {"thresholding", "use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "use_dynamic_shifting"})
    if (flag(key, false)) unsupported(key, "true");
  double shift_terminal = 0.0;
  if (r.has("shift_terminal") && (r.number("shift_terminal", shift_terminal), shift_terminal != 0.0)) unsupported("shift_terminal", "set");
  if (r.has("disable_corrector")) {
    const nlohmann::json& d = r.raw("disable_corrector");
    if (!d.is_array()) r.fail("disable_corrector", "must be a list of step indices, got " + d.dump());
    if (!d.empty()) unsupported("disable_corrector", d.dump() + " (only [] is)");
  }
  for (const char* key : {"solver_p", "variance_type"})
    if (r.has(key)) unsupported(key, r.raw(key).dump());
  // Shapes a timestep grid that the flow-sigma branch overwrites; diffusers still rejects others.
  std::string spacing = "linspace";
  r.text("timestep_spacing", spacing, {"linspace", "leading", "trailing"});
  return c;  // keys that do not affect this configuration (the beta schedule, steps_offset, ...) are ignored
}

UniPCConfig UniPCConfig::load(const std::string& path) { return from_json(read_json_file(path), path); }

UniPCMultistepScheduler::UniPCMultistepScheduler(UniPCConfig config) : config_(std::move(config)) {
  if (config_.solver_order < 1 || config_.solver_order > 2)
    throw Error("UniPCMultistepScheduler: solver_order must be 1 or 2, got " + std::to_string(config_.solver_order));
  if (!(config_.flow_shift > 0)) throw Error("UniPCMultistepScheduler: flow_shift must be positive");
  if (config_.num_train_timesteps < 1) throw Error("UniPCMultistepScheduler: num_train_timesteps must be positive");
}

void UniPCMultistepScheduler::set_timesteps(int steps) {
  if (steps < 1) throw Error("UniPCMultistepScheduler: steps must be at least 1, got " + std::to_string(steps));
  // float64 throughout, as diffusers' numpy code: numpy's linspace(1, 1/T, N + 1) is k * step + 1
  // (its last point, 1/T, is dropped), then the flow shift.
  const auto n = static_cast<std::size_t>(steps);
  const double train = static_cast<double>(config_.num_train_timesteps);
  const double shift = config_.flow_shift;
  const double delta = (1.0 / train - 1.0) / static_cast<double>(steps);
  std::vector<double> sigma(n);
  for (std::size_t k = 0; k < n; ++k) {
    const double u = static_cast<double>(k) * delta + 1.0;
    const double scaled = shift * u;
    const double denominator = 1.0 + (shift - 1.0) * u;
    sigma[k] = scaled / denominator;
  }
  // Keeps log(1 - sigma_0) finite; always applies, since the shift maps 1 to 1.
  if (std::fabs(sigma[0] - 1.0) < 1e-6) sigma[0] -= 1e-6;
  sigmas_.resize(n + 1);
  timesteps_.resize(n);
  for (std::size_t k = 0; k < n; ++k) {
    // int64 truncation of the float64 product (999 for the first step, not 1000).
    timesteps_[k] = static_cast<float>(static_cast<int64_t>(sigma[k] * train));
    sigmas_[k] = static_cast<float>(sigma[k]);
  }
  sigmas_[n] = 0.0f;  // final_sigmas_type "zero"
  step_index_ = 0;
  x0_history_.clear();
  last_sample_ = Tensor();
  last_order_ = 0;
}

float UniPCMultistepScheduler::lambda(int index) const {
  const float s = sigmas_[static_cast<std::size_t>(index)];
  return std::log(1.0f - s) - std::log(s);
}

std::string UniPCMultistepScheduler::name() const {
  char text[96];
  std::snprintf(text, sizeof text, "UniPC multistep (order %d, flow shift %g)", config_.solver_order, config_.flow_shift);
  return text;
}

Tensor UniPCMultistepScheduler::step(const Tensor& output, const Tensor& sample, const Stream& stream) {
  const Tensor model_output = output.dtype() == DType::bf16 ? ops::cast(output, DType::f32, stream) : output;
  const int i = step_index_;
  if (i >= steps())
    throw Error("UniPCMultistepScheduler: step " + std::to_string(i + 1) + " of " + std::to_string(steps()) +
                " schedule (call set_timesteps first)");
  if (model_output.shape() != sample.shape())
    throw Error("UniPCMultistepScheduler: the model output " + shape_to_string(model_output.shape()) + " and the sample " +
                shape_to_string(sample.shape()) + " must have the same shape");
  if (model_output.dtype() != DType::f32 || sample.dtype() != DType::f32)
    throw Error(std::string("UniPCMultistepScheduler: the model output and the sample must be f32, got ") +
                std::string(dtype_name(model_output.dtype())) + " and " + std::string(dtype_name(sample.dtype())));
  if (last_sample_.defined() && last_sample_.shape() != sample.shape())
    throw Error("UniPCMultistepScheduler: the sample " + shape_to_string(sample.shape()) + " changed shape since the last step (" +
                shape_to_string(last_sample_.shape()) + ")");

  auto move = [&](int from, int to) {
    const float st = sigmas_[static_cast<std::size_t>(to)], ss = sigmas_[static_cast<std::size_t>(from)];
    if (st == 0.0f) return Move{0.0f, std::numeric_limits<float>::infinity(), -1.0f, -1.0f};
    const float h = lambda(to) - lambda(from);
    const float phi = std::expm1(-h);
    return Move{st / ss, h, phi, (1.0f - st) * phi};
  };

  // Data prediction from the (uncorrected) sample: x0 = x - sigma_i v.
  const Tensor x0 = ops::muls_add(model_output, sample, -sigmas_[static_cast<std::size_t>(i)], stream);

  // UniC: correct the sample this step starts from, with the order of the previous predictor.
  Tensor x = sample;
  if (i > 0 && last_sample_.defined()) {
    const Move m = move(i - 1, i);
    const Tensor& previous = x0_history_.back();
    float rho_d = 0.0f, rho_last = 0.5f, r = 1.0f;  // order 1: rho = [0.5], fixed
    if (last_order_ == 2) {
      r = (lambda(i - 2) - lambda(i - 1)) / m.h;
      // b_k from g_1 = phi / hh - 1, g_2 = g_1 / hh - 1/2 (hh = -h); then [[1, 1], [r, 1]] rho = b,
      // by Gaussian elimination with partial pivoting as LAPACK's solver does.
      const float hh = -m.h;
      const float g1 = m.phi / hh - 1.0f;
      const float g2 = g1 / hh - 0.5f;
      const float b1 = g1 * 1.0f / m.phi, b2 = g2 * 2.0f / m.phi;
      if (std::fabs(r) > 1.0f) {
        const float l = 1.0f / r;
        rho_last = (b1 - l * b2) / (1.0f - l);
        rho_d = (b2 - rho_last) / r;
      } else {
        rho_last = (b2 - r * b1) / (1.0f - r);
        rho_d = b1 - rho_last;
      }
    }
    Tensor c = ops::mul(last_sample_, scalar(m.ratio), stream);
    c = ops::muls_add(previous, c, -m.alpha_phi, stream);
    c = ops::muls_add(ops::sub(x0, previous, stream), c, -m.alpha_phi * rho_last, stream);
    if (last_order_ == 2)
      c = ops::muls_add(ops::sub(x0_history_[x0_history_.size() - 2], previous, stream), c, -m.alpha_phi * (rho_d / r), stream);
    x = c;
  }

  x0_history_.push_back(x0);
  if (x0_history_.size() > static_cast<std::size_t>(config_.solver_order)) x0_history_.erase(x0_history_.begin());
  // Warm-up (order i + 1) and lower_order_final (order 1 on the last step).
  const int order = std::min({config_.solver_order, steps() - i, i + 1});
  last_sample_ = x;
  last_order_ = order;

  // UniP from sigma_i to sigma_{i+1}.
  const Move m = move(i, i + 1);
  Tensor out = ops::mul(x, scalar(m.ratio), stream);
  out = ops::muls_add(x0, out, -m.alpha_phi, stream);
  if (order == 2) {
    const float r = (lambda(i - 1) - lambda(i)) / m.h;
    out = ops::muls_add(ops::sub(x0_history_[x0_history_.size() - 2], x0, stream), out, -m.alpha_phi * (0.5f / r), stream);
  }
  ++step_index_;
  return out;
}

}  // namespace cubevec::pipelines
