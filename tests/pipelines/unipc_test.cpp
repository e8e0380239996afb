// UniPCMultistepScheduler against tests/data/unipc_reference.safetensors (written by
// tests/reference/make_unipc_reference.py, which documents the numerics): the sigma grid and the
// truncated timesteps of set_timesteps, and whole sampling trajectories of a synthetic linear
// model replayed step by step; plus the shipped Wan2.1 configs and the config / use errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ops/op_stream.h"
#include "pipelines/unipc.h"
#include "tensor/safetensors.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace unipc_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using nlohmann::json;

const SafetensorsFile& reference() {
  static const SafetensorsFile file = SafetensorsFile::open(std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/unipc_reference.safetensors");
  return file;
}

// The reference's trajectory cases: name -> {"steps": N, "config": {...}}.
std::vector<std::pair<std::string, json>> cases() {
  std::vector<std::pair<std::string, json>> out;
  for (const auto& [name, text] : reference().metadata())
    if (!name.empty() && name[0] != '_') out.emplace_back(name, json::parse(text));
  return out;
}

// |a - b| in units in the last place of float.
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

std::vector<int32_t> ints(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::vector<int32_t>(c.data<int32_t>(), c.data<int32_t>() + c.numel());
}

// Checks the scheduler's grid against reference sigmas / timesteps; returns the largest ulp distance.
int64_t expect_grid(const pipelines::UniPCMultistepScheduler& s, const std::vector<double>& sigmas, const std::vector<int32_t>& timesteps,
                    const std::string& what) {
  EXPECT_EQ(s.sigmas().size(), sigmas.size()) << what;
  EXPECT_EQ(s.timesteps().size(), timesteps.size()) << what;
  int64_t worst = 0;
  for (std::size_t i = 0; i < std::min(sigmas.size(), s.sigmas().size()); ++i) {
    const int64_t d = ulps(s.sigmas()[i], static_cast<float>(sigmas[i]));
    worst = std::max(worst, d);
    EXPECT_LE(d, 1) << what << " sigma " << i << ": " << s.sigmas()[i] << " vs " << sigmas[i];
  }
  for (std::size_t i = 0; i < std::min(timesteps.size(), s.timesteps().size()); ++i)
    EXPECT_EQ(s.timesteps()[i], static_cast<float>(timesteps[i])) << what << " timestep " << i;
  EXPECT_EQ(s.sigmas().back(), 0.0f) << what;
  return worst;
}

TEST(UniPC, SigmasAndTimestepsMatchTheReference) {
  const SafetensorsFile& ref = reference();
  int64_t worst = 0;
  int checked = 0;
  for (const auto& [name, c] : cases()) {
    pipelines::UniPCMultistepScheduler s(pipelines::UniPCConfig::from_json(c["config"], name));
    s.set_timesteps(c["steps"].get<int>());
    EXPECT_EQ(s.steps(), c["steps"].get<int>()) << name;
    worst = std::max(worst, expect_grid(s, values(ref.tensor(name + ".sigmas")), ints(ref.tensor(name + ".timesteps")), name));
    ++checked;
  }
  EXPECT_GE(checked, 10);
  // Every step count 1 .. 100 for several shifts.
  const json grid = json::parse(ref.metadata().at("_grid"));
  for (const double shift : grid["shifts"].get<std::vector<double>>()) {
    char key[64];
    std::snprintf(key, sizeof key, "grid.shift_%g", shift);
    const auto sigmas = values(ref.tensor(std::string(key) + ".sigmas"));
    const auto timesteps = ints(ref.tensor(std::string(key) + ".timesteps"));
    pipelines::UniPCConfig config;
    config.flow_shift = shift;
    pipelines::UniPCMultistepScheduler s(config);
    std::size_t o = 0, ot = 0;
    for (int n = grid["steps"][0]; n <= grid["steps"][1]; ++n) {
      s.set_timesteps(n);
      const auto un = static_cast<std::size_t>(n);
      ASSERT_LE(o + un + 1, sigmas.size());
      worst = std::max(
          worst,
          expect_grid(s, {sigmas.begin() + static_cast<std::ptrdiff_t>(o), sigmas.begin() + static_cast<std::ptrdiff_t>(o + un + 1)},
                      {timesteps.begin() + static_cast<std::ptrdiff_t>(ot), timesteps.begin() + static_cast<std::ptrdiff_t>(ot + un)},
                      std::string(key) + " N=" + std::to_string(n)));
      o += un + 1;
      ot += un;
    }
    EXPECT_EQ(o, sigmas.size());
  }
  // The grid is float64 arithmetic done as numpy does it, so it is exact.
  EXPECT_EQ(worst, 0);
}

// The reference's synthetic model: v = A (over channels) x + b * t / 1000, in double, rounded to f32.
Tensor synthetic_model(const Tensor& x, float t) {
  const auto a = values(reference().tensor("model.A")), b = values(reference().tensor("model.b"));
  const auto xv = values(x);
  const int64_t channels = x.size(1), inner = x.numel() / (x.size(0) * channels);
  std::vector<float> v(xv.size());
  for (int64_t n = 0; n < x.size(0); ++n)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t s = 0; s < inner; ++s) {
        double acc = 0;
        for (int64_t k = 0; k < channels; ++k)
          acc += a[static_cast<std::size_t>(c * channels + k)] * xv[static_cast<std::size_t>((n * channels + k) * inner + s)];
        const auto at = static_cast<std::size_t>((n * channels + c) * inner + s);
        v[at] = static_cast<float>(acc + b[at] * (static_cast<double>(t) / 1000.0));
      }
  return Tensor::from_vector(v, x.shape());
}

// |got - want| <= tol * max(1, max |want|), elementwise; returns the largest scaled error.
double expect_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  const auto g = values(got), w = values(want);
  EXPECT_EQ(g.size(), w.size()) << what;
  double scale = 1;
  for (double e : w) scale = std::max(scale, std::fabs(e));
  double worst = 0;
  for (std::size_t i = 0; i < std::min(g.size(), w.size()); ++i) {
    const double e = std::fabs(g[i] - w[i]) / scale;
    worst = std::max(worst, e);
    if (!(e <= tol)) {
      ADD_FAILURE() << what << " element " << i << ": " << g[i] << " vs " << w[i];
      break;
    }
  }
  return worst;
}

TEST(UniPC, TrajectoriesMatchTheReferenceEveryStep) {
  const SafetensorsFile& ref = reference();
  const Stream& stream = ops::default_op_stream();
  double worst = 0;
  for (const auto& [name, c] : cases()) {
    const Tensor trajectory = ref.tensor(name + ".trajectory"), outputs = ref.tensor(name + ".model_outputs");
    pipelines::UniPCMultistepScheduler s(pipelines::UniPCConfig::from_json(c["config"], name));
    // Twice on the same scheduler: set_timesteps starts a fresh history.
    for (int round = 0; round < 2; ++round) {
      s.set_timesteps(c["steps"].get<int>());
      Tensor x = ref.tensor("noise");
      for (int i = 0; i < s.steps(); ++i) {
        const std::string at = name + " step " + std::to_string(i);
        const Tensor v = synthetic_model(x, s.timesteps()[static_cast<std::size_t>(i)]);
        worst = std::max(worst, expect_close(v, outputs.narrow(0, i, 1).reshape(v.shape()), 1e-5, at + " model output"));
        x = s.step(v, x, stream);
        EXPECT_EQ(s.step_index(), i + 1);
        worst = std::max(worst, expect_close(x, trajectory.narrow(0, i + 1, 1).reshape(x.shape()), 1e-5, at));
      }
      EXPECT_THROW(s.step(x, x, stream), Error) << name;
    }
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", worst);
  RecordProperty("worst_scaled_error", text);
  EXPECT_LT(worst, 1e-5);
}

TEST(UniPC, ShippedWanConfigsLoad) {
  for (const char* model : {"wan2.1-t2v-14b", "wan2.1-t2v-1.3b"}) {
    const auto config =
        pipelines::UniPCConfig::load(std::string(CUBEVEC_SOURCE_DIR) + "/assets/configs/" + model + "/scheduler/scheduler_config.json");
    EXPECT_EQ(config.flow_shift, 3.0) << model;
    EXPECT_EQ(config.solver_order, 2) << model;
    EXPECT_EQ(config.num_train_timesteps, 1000) << model;
    pipelines::UniPCMultistepScheduler s(config);
    s.set_timesteps(50);
    EXPECT_EQ(s.timesteps().front(), 999.0f) << model;  // sigma_0 = 1 - 1e-6, truncated
    EXPECT_EQ(s.sigmas().front(), static_cast<float>(1.0 - 1e-6)) << model;
  }
}

TEST(UniPC, ConfigErrorsNameTheKey) {
  const std::string base = R"("prediction_type": "flow_prediction", "use_flow_sigmas": true)";
  const struct {
    std::string json_text, expected;
  } cases[] = {
      {"{}", "'prediction_type' is \"epsilon\" (diffusers' default)"},
      {R"({"prediction_type": "v_prediction", "use_flow_sigmas": true})", "'prediction_type' is \"v_prediction\""},
      {R"({"prediction_type": "flow_prediction"})", "'use_flow_sigmas' is false (diffusers' default)"},
      {R"({"prediction_type": "flow_prediction", "use_flow_sigmas": false})", "'use_flow_sigmas' is false, which"},
      {"{" + base + R"(, "solver_type": "bh1"})", "'solver_type' is \"bh1\""},
      {"{" + base + R"(, "predict_x0": false})", "'predict_x0' is false"},
      {"{" + base + R"(, "thresholding": true})", "'thresholding' is true"},
      {"{" + base + R"(, "use_karras_sigmas": true})", "'use_karras_sigmas' is true"},
      {"{" + base + R"(, "use_exponential_sigmas": true})", "'use_exponential_sigmas' is true"},
      {"{" + base + R"(, "use_beta_sigmas": true})", "'use_beta_sigmas' is true"},
      {"{" + base + R"(, "use_dynamic_shifting": true})", "'use_dynamic_shifting' is true"},
      {"{" + base + R"(, "final_sigmas_type": "sigma_min"})", "'final_sigmas_type' is \"sigma_min\""},
      {"{" + base + R"(, "lower_order_final": false})", "'lower_order_final' is false"},
      {"{" + base + R"(, "disable_corrector": [0]})", "'disable_corrector' is [0]"},
      {"{" + base + R"(, "variance_type": "learned_range"})", "'variance_type' is \"learned_range\""},
      {"{" + base + R"(, "shift_terminal": 0.1})", "'shift_terminal' is set"},
      {"{" + base + R"(, "solver_order": 3})", "'solver_order' is 3"},
      {"{" + base + R"(, "solver_order": 0})", "'solver_order' must be an integer in [1, 16777216]"},
      {"{" + base + R"(, "flow_shift": "three"})", "'flow_shift' must be a number in [0.0001, 10000], got \"three\""},
      {"{" + base + R"(, "flow_shift": -1})", "'flow_shift' must be a number in [0.0001, 10000], got -1"},
      {"{" + base + R"(, "flow_shift": 1e308})", "'flow_shift' must be a number in [0.0001, 10000], got 1e+308"},
      {"{" + base + R"(, "num_train_timesteps": 0})", "'num_train_timesteps' must be an integer in [2, 1000000], got 0"},
      {"{" + base + R"(, "num_train_timesteps": 1})", "'num_train_timesteps' must be an integer in [2, 1000000], got 1"},
      {"{" + base + R"(, "timestep_spacing": "cubic"})", "'timestep_spacing' must be"},
      {"{" + base + R"(, "thresholding": "no"})", "'thresholding' must be true or false"},
      {R"({"_class_name": "FlowMatchEulerDiscreteScheduler"})", "expected \"UniPCMultistepScheduler\""},
      {"[]", "expected a JSON object"},
  };
  for (const auto& c : cases) {
    const std::string message =
        message_of([&] { pipelines::UniPCConfig::from_json(json::parse(c.json_text), "wan/scheduler_config.json"); });
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.json_text << " -> " << message;
    EXPECT_EQ(message.rfind("wan/scheduler_config.json: ", 0), 0u) << message;
  }
  // Accepted: diffusers' aliases of bh2, keys without effect here, unknown keys.
  const auto ok = pipelines::UniPCConfig::from_json(
      json::parse("{" + base + R"(, "solver_type": "midpoint", "timestep_spacing": "trailing", "steps_offset": 1,
                  "beta_schedule": "scaled_linear", "disable_corrector": [], "shift_terminal": null,
                  "rescale_betas_zero_snr": false, "some_future_key": 7, "flow_shift": 5.0, "solver_order": 1})"),
      "x");
  EXPECT_EQ(ok.flow_shift, 5.0);
  EXPECT_EQ(ok.solver_order, 1);
  EXPECT_NE(
      message_of([] { pipelines::UniPCConfig::load("/nonexistent/scheduler_config.json"); }).find("/nonexistent/scheduler_config.json"),
      std::string::npos);
}

TEST(UniPC, UseErrors) {
  const Stream& stream = ops::default_op_stream();
  pipelines::UniPCConfig config;
  config.flow_shift = 3.0;
  pipelines::UniPCMultistepScheduler s(config);
  const Tensor x = Tensor::zeros({4}, DType::f32);
  EXPECT_NE(message_of([&] { s.step(x, x, stream); }).find("step 1 of 0 schedule (call set_timesteps first)"), std::string::npos);
  EXPECT_NE(message_of([&] { s.set_timesteps(0); }).find("steps must be at least 1"), std::string::npos);
  s.set_timesteps(2);
  EXPECT_NE(message_of([&] { s.step(x, Tensor::zeros({5}, DType::f32), stream); }).find("must have the same shape"), std::string::npos);
  EXPECT_NE(message_of([&] { s.step(Tensor::zeros({4}, DType::f16), x, stream); }).find("must be f32"), std::string::npos);
  EXPECT_EQ(s.step_index(), 0);
  Tensor y = s.step(x, x, stream);
  EXPECT_NE(message_of([&] {
              s.step(Tensor::zeros({2, 2}, DType::f32), Tensor::zeros({2, 2}, DType::f32), stream);
            }).find("changed shape"),
            std::string::npos);
  y = s.step(x, y, stream);
  EXPECT_NE(message_of([&] { s.step(x, y, stream); }).find("step 3 of 2 schedule"), std::string::npos);
  config.solver_order = 3;
  EXPECT_NE(message_of([&] { pipelines::UniPCMultistepScheduler bad(config); }).find("solver_order must be 1 or 2"), std::string::npos);
}

}  // namespace unipc_test
}  // namespace cubevec
