// FlowMatchEulerScheduler against tests/data/flowmatch_reference.json (written by
// tests/reference/make_flux_reference.py from the porting spec with numpy's float32 rules):
// sigmas and timesteps to the bit, Flux's mu, the Euler step; and config errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ops/op_stream.h"
#include "pipelines/flow_match.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace flow_match_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using nlohmann::json;

json reference() {
  std::ifstream in(std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/flowmatch_reference.json");
  return json::parse(in);
}

// |a - b| in units in the last place of float.
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

TEST(FlowMatch, SigmasAndTimestepsMatchTheReference) {
  const json ref = reference();
  int cases = 0;
  for (const json& c : ref["cases"]) {
    const std::string name = c["name"];
    const auto config = pipelines::FlowMatchConfig::from_json(c["config"], name);
    pipelines::FlowMatchEulerScheduler scheduler(config);
    std::optional<double> mu;
    if (!c["mu"].is_null()) mu = c["mu"].get<double>();
    if (c.contains("image_seq_len") && !c["image_seq_len"].is_null() && config.use_dynamic_shifting) {
      EXPECT_DOUBLE_EQ(pipelines::flux_mu(config, c["image_seq_len"].get<int64_t>()), *mu) << name;
    }
    if (c["input_sigmas_f32"].is_null()) {
      scheduler.set_timesteps(c["num_inference_steps"].get<int>(), mu);
    } else {
      scheduler.set_sigmas(c["input_sigmas_f32"].get<std::vector<double>>(), mu);
    }
    const auto sigmas = c["sigmas"].get<std::vector<double>>(), timesteps = c["timesteps"].get<std::vector<double>>();
    ASSERT_EQ(scheduler.sigmas().size(), sigmas.size()) << name;
    ASSERT_EQ(scheduler.timesteps().size(), timesteps.size()) << name;
    for (std::size_t i = 0; i < sigmas.size(); ++i)
      EXPECT_EQ(ulps(scheduler.sigmas()[i], static_cast<float>(sigmas[i])), 0)
          << name << " sigma " << i << ": " << scheduler.sigmas()[i] << " vs " << sigmas[i];
    for (std::size_t i = 0; i < timesteps.size(); ++i)
      EXPECT_EQ(ulps(scheduler.timesteps()[i], static_cast<float>(timesteps[i])), 0) << name << " timestep " << i;
    EXPECT_EQ(scheduler.sigmas().back(), 0.0f) << name;
    ++cases;
  }
  EXPECT_GE(cases, 8);
}

TEST(FlowMatch, FluxScheduleAndEulerStep) {
  const json ref = reference();
  // set_flux_timesteps(28, 4096) is the first reference case.
  const json& c = ref["cases"][0];
  pipelines::FlowMatchEulerScheduler scheduler(pipelines::FlowMatchConfig::from_json(c["config"], "case 0"));
  scheduler.set_flux_timesteps(28, 4096);
  const auto sigmas = c["sigmas"].get<std::vector<double>>();
  for (std::size_t i = 0; i < sigmas.size(); ++i) EXPECT_LE(ulps(scheduler.sigmas()[i], static_cast<float>(sigmas[i])), 1) << i;
  // One Euler step: x + (sigma_next - sigma) v.
  const json& e = ref["euler_step"];
  const auto x = e["x"].get<std::vector<float>>(), v = e["v"].get<std::vector<float>>();
  const auto want = e["expected"].get<std::vector<double>>();
  const int64_t n = static_cast<int64_t>(x.size());
  // The reference's step is step `step_index` of its case; replay the case and step there.
  const std::string from = e["from_case"];
  const json* source = nullptr;
  for (const json& cc : ref["cases"])
    if (cc["name"] == from) source = &cc;
  ASSERT_NE(source, nullptr) << from;
  pipelines::FlowMatchEulerScheduler s3(pipelines::FlowMatchConfig::from_json((*source)["config"], from));
  std::optional<double> mu;
  if (!(*source)["mu"].is_null()) mu = (*source)["mu"].get<double>();
  if ((*source)["input_sigmas_f32"].is_null()) s3.set_timesteps((*source)["num_inference_steps"].get<int>(), mu);
  else s3.set_sigmas((*source)["input_sigmas_f32"].get<std::vector<double>>(), mu);
  const int index = e["step_index"].get<int>();
  const Tensor xt = Tensor::from_vector(x, {n}), vt = Tensor::from_vector(v, {n});
  for (int i = 0; i < index; ++i) s3.step(vt, xt, ops::default_op_stream());
  EXPECT_EQ(s3.sigmas()[static_cast<std::size_t>(index)], e["sigma"].get<float>());
  const auto got = values(s3.step(vt, xt, ops::default_op_stream()));
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], want[i], 1e-6 * std::max(1.0, std::fabs(want[i]))) << i;
  EXPECT_EQ(s3.step_index(), index + 1);
}

TEST(FlowMatch, ConfigAndUseErrors) {
  const struct {
    std::string json_text, expected;
  } cases[] = {
      {R"({"shift": "three"})", "'shift' must be a number in [0.0001, 10000], got \"three\""},
      {R"({"shift": 1e308})", "'shift' must be a number in [0.0001, 10000], got 1e+308"},
      {R"({"max_shift": 800})", "'max_shift' must be a number in [-10, 10], got 800"},
      {R"({"use_dynamic_shifting": true, "base_image_seq_len": 256, "max_image_seq_len": 256})",
       "'max_image_seq_len' must be above base_image_seq_len (256) with use_dynamic_shifting, got 256"},
      {R"({"use_karras_sigmas": true})", "'use_karras_sigmas' is true, which cubevec does not implement"},
      {R"({"shift_terminal": 0.1})", "'shift_terminal' is set"},
      {R"({"_class_name": "UniPCMultistepScheduler"})", "expected \"FlowMatchEulerDiscreteScheduler\""},
      {R"({"time_shift_type": "cubic"})", "'time_shift_type' must be"},
      {R"({"num_train_timesteps": 1})", "'num_train_timesteps' must be an integer in [2, 1000000], got 1"},
  };
  for (const auto& c : cases)
    EXPECT_NE(message_of([&] { pipelines::FlowMatchConfig::from_json(json::parse(c.json_text), "sched.json"); }).find(c.expected),
              std::string::npos)
        << c.expected;
  pipelines::FlowMatchConfig dynamic;
  dynamic.use_dynamic_shifting = true;
  pipelines::FlowMatchEulerScheduler s(dynamic);
  EXPECT_NE(message_of([&] { s.set_timesteps(4); }).find("use_dynamic_shifting needs mu"), std::string::npos);
  EXPECT_NE(message_of([&] { s.set_timesteps(0, 1.0); }).find("steps must be at least 1"), std::string::npos);
  s.set_timesteps(1, 1.0);
  const Tensor x = Tensor::zeros({4}, DType::f32);
  s.step(x, x, ops::default_op_stream());
  EXPECT_NE(message_of([&] { s.step(x, x, ops::default_op_stream()); }).find("step 2 of 1 schedule"), std::string::npos);
  s.set_timesteps(2, 1.0);
  EXPECT_NE(message_of([&] { s.step(x, Tensor::zeros({5}, DType::f32), ops::default_op_stream()); }).find("must have the same shape"),
            std::string::npos);
}

}  // namespace flow_match_test
}  // namespace cubevec
