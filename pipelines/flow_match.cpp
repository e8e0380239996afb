#include "pipelines/flow_match.h"

#include <cmath>
#include <cstdio>

#include "ops/vector_ops.h"
#include "base/config_reader.h"
#include "base/error.h"
#include "base/strict_json.h"

namespace cubevec::pipelines {

namespace {

// shift * s / (1 + (shift - 1) * s), each operation in float32 as numpy/torch do on float32 arrays.
float static_shift(float s, double shift) {
  const auto f = static_cast<float>(shift);
  return (f * s) / (1.0f + (static_cast<float>(shift - 1.0)) * s);
}

}  // namespace

FlowMatchConfig FlowMatchConfig::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "FlowMatchEulerDiscreteScheduler");
  r.expect_class({"FlowMatchEulerDiscreteScheduler"});
  FlowMatchConfig c;
  // Bounds that keep every sigma finite (a shift of 1e308 or exp(mu) overflowing gave NaN sigmas).
  r.integer("num_train_timesteps", c.num_train_timesteps, 2, 1000000)
      .number_in("shift", c.shift, 1e-4, 1e4)
      .boolean("use_dynamic_shifting", c.use_dynamic_shifting)
      .number_in("base_shift", c.base_shift, -10.0, 10.0)
      .number_in("max_shift", c.max_shift, -10.0, 10.0)
      .integer("base_image_seq_len", c.base_image_seq_len, 1)
      .integer("max_image_seq_len", c.max_image_seq_len, 1)
      .text("time_shift_type", c.time_shift_type, {"exponential", "linear"});
  // mu is interpolated between the two lengths: equal ones divide by zero.
  if (c.use_dynamic_shifting && c.max_image_seq_len <= c.base_image_seq_len)
    r.fail("max_image_seq_len", "must be above base_image_seq_len (" + std::to_string(c.base_image_seq_len) +
                                    ") with use_dynamic_shifting, got " + std::to_string(c.max_image_seq_len));
  for (const char* key : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas", "stochastic_sampling"}) {
    bool on = false;
    r.boolean(key, on);
    if (on) r.fail(key, "is true, which cubevec does not implement");
  }
  if (r.has("shift_terminal")) r.fail("shift_terminal", "is set, which cubevec does not implement");
  return c;  // other keys are ignored, as diffusers ignores them
}

FlowMatchConfig FlowMatchConfig::load(const std::string& path) {
  const nlohmann::json json = read_json_file(path);
  return from_json(json, path);
}

double flux_mu(const FlowMatchConfig& c, int64_t image_seq_len) {
  const double m = (c.max_shift - c.base_shift) / static_cast<double>(c.max_image_seq_len - c.base_image_seq_len);
  const double b = c.base_shift - m * static_cast<double>(c.base_image_seq_len);
  return static_cast<double>(image_seq_len) * m + b;
}

FlowMatchEulerScheduler::FlowMatchEulerScheduler(FlowMatchConfig config) : config_(std::move(config)) {
  // The trained sigmas k/1000 for k = 1000 .. 1 (float32), shifted unless the shift is dynamic.
  const auto n = config_.num_train_timesteps;
  auto trained = [&](int64_t k) {
    const float s = static_cast<float>(k) / static_cast<float>(n);
    return config_.use_dynamic_shifting ? s : static_shift(s, config_.shift);
  };
  sigma_max_ = trained(n);
  sigma_min_ = trained(1);
}

void FlowMatchEulerScheduler::set_timesteps(int steps, std::optional<double> mu) {
  if (steps < 1) throw Error("FlowMatchEulerScheduler: steps must be at least 1, got " + std::to_string(steps));
  // diffusers builds these in numpy float64 (linspace of Python floats), shifts them in float64
  // and only then casts to float32.
  const double n = static_cast<double>(config_.num_train_timesteps);
  const double t0 = static_cast<double>(sigma_max_) * n, t1 = static_cast<double>(sigma_min_) * n;
  std::vector<double> sigmas(static_cast<std::size_t>(steps));
  for (int i = 0; i < steps; ++i) {
    const double t = steps == 1 ? t0 : t0 + (t1 - t0) * static_cast<double>(i) / static_cast<double>(steps - 1);
    sigmas[static_cast<std::size_t>(i)] = t / n;
  }
  if (steps > 1) sigmas.back() = t1 / n;  // numpy's linspace ends exactly at its stop
  if (config_.use_dynamic_shifting) {
    if (!mu) throw Error("FlowMatchEulerScheduler: use_dynamic_shifting needs mu");
    const double e = config_.time_shift_type == "linear" ? *mu : std::exp(*mu);
    for (double& s : sigmas) s = e / (e + (1.0 / s - 1.0));
  } else {
    for (double& s : sigmas) s = config_.shift * s / (1.0 + (config_.shift - 1.0) * s);
  }
  std::vector<float> f(sigmas.size());
  for (std::size_t i = 0; i < sigmas.size(); ++i) f[i] = static_cast<float>(sigmas[i]);
  finish(std::move(f), std::nullopt, /*already_shifted=*/true);
}

void FlowMatchEulerScheduler::set_sigmas(const std::vector<double>& sigmas, std::optional<double> mu) {
  if (sigmas.empty()) throw Error("FlowMatchEulerScheduler: sigmas must not be empty");
  std::vector<float> f(sigmas.size());
  for (std::size_t i = 0; i < sigmas.size(); ++i) f[i] = static_cast<float>(sigmas[i]);
  finish(std::move(f), mu);
}

void FlowMatchEulerScheduler::set_flux_timesteps(int steps, int64_t image_seq_len) {
  if (steps < 1) throw Error("FlowMatchEulerScheduler: steps must be at least 1, got " + std::to_string(steps));
  std::vector<double> sigmas(static_cast<std::size_t>(steps));
  const double stop = 1.0 / steps;
  for (int i = 0; i < steps; ++i)
    sigmas[static_cast<std::size_t>(i)] = steps == 1 ? 1.0 : 1.0 + (stop - 1.0) * static_cast<double>(i) / (steps - 1);
  if (steps > 1) sigmas.back() = stop;
  set_sigmas(sigmas, flux_mu(config_, image_seq_len));
}

void FlowMatchEulerScheduler::begin_at(int index) {
  if (index < 0 || index >= static_cast<int>(timesteps_.size()) || step_index_ != 0 || begun_)
    throw Error("FlowMatchEulerScheduler: cannot begin at step " + std::to_string(index) + " of " + std::to_string(timesteps_.size()) +
                (step_index_ != 0 || begun_ ? " (the schedule was cut or stepped already)" : ""));
  begun_ = true;
  timesteps_.erase(timesteps_.begin(), timesteps_.begin() + index);
  sigmas_.erase(sigmas_.begin(), sigmas_.begin() + index);
}

void FlowMatchEulerScheduler::finish(std::vector<float> sigmas, std::optional<double> mu, bool already_shifted) {
  if (already_shifted) {
  } else if (config_.use_dynamic_shifting) {
    if (!mu) throw Error("FlowMatchEulerScheduler: use_dynamic_shifting needs mu");
    // exponential: e^mu / (e^mu + (1/s - 1)); linear: mu / (mu + (1/s - 1)); float32 throughout.
    const float e = config_.time_shift_type == "linear" ? static_cast<float>(*mu) : static_cast<float>(std::exp(*mu));
    for (float& s : sigmas) s = e / (e + (1.0f / s - 1.0f));
  } else {
    for (float& s : sigmas) s = static_shift(s, config_.shift);
  }
  timesteps_.resize(sigmas.size());
  for (std::size_t i = 0; i < sigmas.size(); ++i) timesteps_[i] = sigmas[i] * static_cast<float>(config_.num_train_timesteps);
  sigmas.push_back(0.0f);
  sigmas_ = std::move(sigmas);
  step_index_ = 0;
  begun_ = false;  // a new schedule, whole
}

Tensor FlowMatchEulerScheduler::step(const Tensor& v, const Tensor& x, const Stream& stream) {
  if (step_index_ >= steps())
    throw Error("FlowMatchEulerScheduler: step " + std::to_string(step_index_ + 1) + " of " + std::to_string(steps()) +
                " schedule (call set_timesteps first)");
  if (v.shape() != x.shape())
    throw Error("FlowMatchEulerScheduler: the model output " + shape_to_string(v.shape()) + " and the sample " +
                shape_to_string(x.shape()) + " must have the same shape");
  const float dt = sigmas_[static_cast<std::size_t>(step_index_) + 1] - sigmas_[static_cast<std::size_t>(step_index_)];
  ++step_index_;
  const Tensor x32 = ops::cast(x, DType::f32, stream);
  if (v.dtype() == DType::f32) return ops::muls_add(v, x32, dt, stream);
  // diffusers with a bf16 model: prev = sample.float() + dt * v, where dt * v is a bf16 product.
  const Tensor delta = ops::muls_add(v, Tensor::zeros(v.shape(), v.dtype()), dt, stream);
  return ops::add(x32, ops::cast(delta, DType::f32, stream), stream);
}

std::string FlowMatchEulerScheduler::name() const {
  char text[96];
  std::snprintf(text, sizeof text, "FlowMatch Euler (shift %g%s)", config_.shift, config_.use_dynamic_shifting ? ", dynamic" : "");
  return text;
}

}  // namespace cubevec::pipelines
