// MindIE SD's quantized Linear schemes against plain references written from their formulas
// (docs/stages.md, "MindIE SD's quantization files and schemes"): W8A16, W8A8_DYNAMIC, W8A8 static
// with quant_bias / deq_scale, W8A8_TIMESTEP switching by the step policy, SmoothQuant's mul_scale,
// and the fused epilogue; plus the timestep policy file and the checks on each layer's tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ops/vector_ops.h"
#include "quant/schemes.h"
#include "quant/timestep_policy.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace schemes_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using quant::Algorithm;

constexpr int64_t kIn = 37, kOut = 19, kRows = 6;

struct Layer {
  std::vector<int8_t> w;
  std::vector<float> w_scale, bias, mul;
  quant::QuantTensors tensors;
};

Layer make_layer(unsigned seed, bool smooth) {
  Layer l;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  l.w.resize(kIn * kOut);
  for (auto& v : l.w) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  for (int64_t o = 0; o < kOut; ++o) l.w_scale.push_back(0.002f + 0.01f * std::abs(u(rng))), l.bias.push_back(u(rng));
  for (int64_t i = 0; i < kIn; ++i) l.mul.push_back(0.5f + std::abs(u(rng)));
  l.tensors.weight = Tensor::from_vector(l.w, {kOut, kIn});
  l.tensors.weight_scale = Tensor::from_vector(l.w_scale, {kOut});
  l.tensors.bias = Tensor::from_vector(l.bias, {kOut});
  if (smooth) l.tensors.mul_scale = Tensor::from_vector(l.mul, {kIn});
  return l;
}

// rint(v), half to even, clamped.
double q_round(double v, double lo, double hi) { return std::min(hi, std::max(lo, std::nearbyint(v))); }

// The reference of each scheme for row r of x (doubles from the formulas; f32 where the kernels round).
std::vector<double> dynamic_ref(const Layer& l, const std::vector<double>& x, bool smooth) {
  std::vector<double> y(kRows * kOut);
  for (int64_t r = 0; r < kRows; ++r) {
    std::vector<float> xs(kIn);
    float amax = 0;
    for (int64_t i = 0; i < kIn; ++i) {
      xs[i] = static_cast<float>(x[r * kIn + i]) * (smooth ? l.mul[i] : 1.0f);
      amax = std::max(amax, std::abs(xs[i]));
    }
    const float s = amax / 127.0f;
    for (int64_t o = 0; o < kOut; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < kIn; ++i) acc += q_round(xs[i] / s, -127, 127) * l.w[o * kIn + i];
      y[r * kOut + o] = acc * s * l.w_scale[o] + l.bias[o];
    }
  }
  return y;
}

std::vector<double> static_ref(const Layer& l, const std::vector<double>& x, float scale, float offset, const std::vector<float>& deq,
                               const std::vector<int32_t>& qbias, bool smooth) {
  std::vector<double> y(kRows * kOut);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t o = 0; o < kOut; ++o) {
      double acc = qbias[o];
      for (int64_t i = 0; i < kIn; ++i) {
        const float xs = static_cast<float>(x[r * kIn + i]) * (smooth ? l.mul[i] : 1.0f);
        acc += q_round(xs / scale + offset, -128, 127) * l.w[o * kIn + i];
      }
      y[r * kOut + o] = acc * deq[o];
    }
  return y;
}

void expect_near_all(const Tensor& got, const std::vector<double>& want, const std::string& what) {
  const std::vector<double> g = values(got);
  ASSERT_EQ(g.size(), want.size()) << what;
  for (std::size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], want[i], 2e-5 * std::max(1.0, std::abs(want[i]))) << what << " " << i;
}

TEST(QuantSchemes, W8A16IsTheDequantizedWeight) {
  const Layer l = make_layer(1, false);
  const Tensor x = random_tensor({kRows, kIn}, 2, DType::f32, 1.0f);
  const auto layer = quant::make_quantized_linear(Algorithm::w8a16, kIn, kOut, l.tensors, nullptr, "w8a16");
  const std::vector<double> xv = values(x);
  std::vector<double> want(kRows * kOut);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t o = 0; o < kOut; ++o) {
      double acc = l.bias[o];
      for (int64_t i = 0; i < kIn; ++i) acc += xv[r * kIn + i] * static_cast<double>(static_cast<float>(l.w[o * kIn + i]) * l.w_scale[o]);
      want[r * kOut + o] = acc;
    }
  expect_near_all(layer->forward(x, {}, 0, ops::default_op_stream()), want, "W8A16");
  EXPECT_LT(layer->weight_bytes(), static_cast<std::size_t>(4 * kIn * kOut) / 3);
}

TEST(QuantSchemes, DynamicPerTokenWithAndWithoutSmoothing) {
  for (bool smooth : {false, true}) {
    const Layer l = make_layer(3, smooth);
    const Tensor x = random_tensor({kRows, kIn}, 4, DType::f32, 2.0f);
    const auto layer = quant::make_quantized_linear(Algorithm::w8a8_dynamic, kIn, kOut, l.tensors, nullptr, "dyn");
    expect_near_all(layer->forward(x, {}, 0, ops::default_op_stream()), dynamic_ref(l, values(x), smooth), smooth ? "smooth" : "plain");
  }
}

TEST(QuantSchemes, StaticFoldsTheBiasIntoQuantBias) {
  const Layer l = make_layer(5, true);
  quant::QuantTensors t = l.tensors;
  t.bias = Tensor();  // static W8A8 adds no float bias
  const float scale = 0.03f, offset = -7.0f;
  std::vector<float> deq(kOut);
  std::vector<int32_t> qbias(kOut);
  for (int64_t o = 0; o < kOut; ++o) deq[o] = scale * l.w_scale[o], qbias[o] = static_cast<int32_t>(o * 37 - 300);
  t.input_scale = Tensor::from_vector(std::vector<float>{scale}, {1});
  t.input_offset = Tensor::from_vector(std::vector<float>{offset}, {1});
  t.deq_scale = Tensor::from_vector(deq, {kOut});
  t.quant_bias = Tensor::from_vector(qbias, {kOut});
  const Tensor x = random_tensor({kRows, kIn}, 6, DType::f32, 2.0f);
  const auto layer = quant::make_quantized_linear(Algorithm::w8a8, kIn, kOut, t, nullptr, "static");
  expect_near_all(layer->forward(x, {}, 0, ops::default_op_stream()), static_ref(l, values(x), scale, offset, deq, qbias, true), "static");
  // With the Linear's fused epilogue: GELU-tanh then residual + gate * y.
  const Tensor residual = random_tensor({kRows, kOut}, 7, DType::f32, 1.0f), gate = random_tensor({kOut}, 8, DType::f32, 1.0f);
  std::vector<double> want = static_ref(l, values(x), scale, offset, deq, qbias, true);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t o = 0; o < kOut; ++o) {
      double& y = want[r * kOut + o];
      y = residual.data<float>()[r * kOut + o] + gate.data<float>()[o] * ops::activation_reference(ops::Activation::gelu_tanh, y);
    }
  ops::MatmulOptions e{.activation = ops::GemmActivation::gelu_tanh, .residual = residual, .gate = gate};
  expect_near_all(layer->forward(x, e, 0, ops::default_op_stream()), want, "static with epilogue");
}

TEST(QuantSchemes, TimestepSwitchesBetweenStaticRowsAndDynamic) {
  const Layer l = make_layer(9, false);
  quant::QuantTensors t = l.tensors;
  const int64_t steps = 3;
  std::vector<float> scales = {0.02f, 0.03f, 0.05f}, offsets = {0.0f, -5.0f, 4.0f}, deq(steps * kOut);
  std::vector<int32_t> qbias(steps * kOut);
  for (int64_t s = 0; s < steps; ++s)
    for (int64_t o = 0; o < kOut; ++o)
      deq[s * kOut + o] = scales[s] * l.w_scale[o], qbias[s * kOut + o] = static_cast<int32_t>(s * 100 + o);
  t.input_scale = Tensor::from_vector(scales, {steps});
  t.input_offset = Tensor::from_vector(offsets, {steps});
  t.deq_scale = Tensor::from_vector(deq, {steps, kOut});
  t.quant_bias = Tensor::from_vector(qbias, {steps, kOut});
  auto policy = std::make_shared<quant::TimestepPolicy>(
      quant::TimestepPolicy::from_json(nlohmann::json::parse(R"({"default": "dynamic", "static": [0, 2]})"), "policy.json"));
  const auto layer = quant::make_quantized_linear(Algorithm::w8a8_timestep, kIn, kOut, t, policy, "timestep");
  const Tensor x = random_tensor({kRows, kIn}, 10, DType::f32, 2.0f);
  const std::vector<double> xv = values(x);
  for (int step : {0, 2}) {
    const std::vector<float> d(deq.begin() + step * kOut, deq.begin() + (step + 1) * kOut);
    const std::vector<int32_t> b(qbias.begin() + step * kOut, qbias.begin() + (step + 1) * kOut);
    expect_near_all(layer->forward(x, {}, step, ops::default_op_stream()), static_ref(l, xv, scales[step], offsets[step], d, b, false),
                    "static step " + std::to_string(step));
  }
  for (int step : {1, 7}) expect_near_all(layer->forward(x, {}, step, ops::default_op_stream()), dynamic_ref(l, xv, false), "dynamic step");
  // A step the policy makes static beyond the file's rows is an error, not a wrong answer.
  auto all_static = std::make_shared<quant::TimestepPolicy>();
  all_static->set_default(quant::Strategy::static_scales);
  const auto strict = quant::make_quantized_linear(Algorithm::w8a8_timestep, kIn, kOut, t, all_static, "timestep");
  EXPECT_NE(message_of([&] { strict->forward(x, {}, 3, ops::default_op_stream()); }).find("static scales for 3 steps"), std::string::npos);
}

TEST(QuantSchemes, LayerTensorChecksNameTheProblem) {
  const Layer l = make_layer(11, false);
  auto bad = [&](auto edit, Algorithm algo = Algorithm::w8a8_dynamic) {
    quant::QuantTensors t = l.tensors;
    edit(t);
    return message_of([&] { quant::make_quantized_linear(algo, kIn, kOut, t, nullptr, "file.safetensors: blocks.0.attn1.to_q"); });
  };
  EXPECT_NE(bad([](auto& t) { t.weight_scale = Tensor(); }).find("blocks.0.attn1.to_q: missing 'weight_scale' (expected f32 [19])"),
            std::string::npos);
  EXPECT_NE(bad([](auto& t) {
              t.weight = Tensor::zeros({kOut, kIn + 1}, DType::i8);
            }).find("'weight' must be i8 [19, 37], got i8 [19, 38]"),
            std::string::npos);
  EXPECT_NE(
      bad([](auto& t) { t.weight_scale = Tensor::zeros({kOut}, DType::f32); }).find("'weight_scale' must hold positive finite numbers"),
      std::string::npos);
  EXPECT_NE(bad([](auto& t) { t.mul_scale = Tensor::zeros({kIn}, DType::f32); }, Algorithm::w8a16).find("never applies it"),
            std::string::npos);
  EXPECT_NE(bad([](auto& t) {
              std::vector<float> mul(kIn, 1.0f);
              mul[3] = std::nanf("");
              t.mul_scale = Tensor::from_vector(mul, {kIn});
            }).find("'div.mul_scale' must hold positive finite numbers"),
            std::string::npos);
  EXPECT_NE(bad(
                [](auto& t) {
                  t.input_scale = Tensor::from_vector(std::vector<float>{0.1f}, {1});
                  t.input_offset = Tensor::from_vector(std::vector<float>{0.5f}, {1});
                  t.deq_scale = Tensor::from_vector(std::vector<float>(kOut, 0.01f), {kOut});
                  t.quant_bias = Tensor::zeros({kOut}, DType::i32);
                },
                Algorithm::w8a8)
                .find("'input_offset' must hold integers in [-128, 127]"),
            std::string::npos);
}

TEST(TimestepPolicy, FileFormatAndErrors) {
  const auto load = [](const char* text) { return quant::TimestepPolicy::from_json(nlohmann::json::parse(text), "p.json"); };
  const quant::TimestepPolicy p = load(R"({"default": "static", "dynamic": [1, {"from": 4, "to": 6}]})");
  for (int s : {0, 2, 3, 7, 999}) EXPECT_EQ(p.strategy(s), quant::Strategy::static_scales) << s;
  for (int s : {1, 4, 5, 6}) EXPECT_EQ(p.strategy(s), quant::Strategy::dynamic) << s;
  const auto error = [&](const char* text) { return message_of([&] { load(text); }); };
  EXPECT_NE(error(R"({"default": "fixed"})").find("'default' must be one of \"static\", \"dynamic\""), std::string::npos);
  EXPECT_NE(error(R"({"static": [1, "2"]})").find("'static' entries must be step indices"), std::string::npos);
  EXPECT_NE(error(R"({"static": [{"from": 5, "to": 2}]})").find("'static' entries must be"), std::string::npos);
  EXPECT_NE(error(R"({"static": [3], "dynamic": [3]})").find("names step 3, which \"static\" names too"), std::string::npos);
  EXPECT_NE(error(R"({"statics": [3]})").find("unknown key 'statics'"), std::string::npos);
}

}  // namespace schemes_test
}  // namespace cubevec
