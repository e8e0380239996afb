// Vector kernels against double-precision definitions written in the test, on odd widths.
#include "ops/vector_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace cubevec {
namespace {

Tensor random_tensor(const Shape& shape, unsigned seed, float scale = 3.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape);
}

TEST(VectorOps, RmsNormMatchesDefinition) {
  for (int64_t h : {1, 7, 17, 129, 1000}) {
    const Tensor x = random_tensor({3, 5, h}, 1), w = random_tensor({h}, 2);
    const Tensor y = ops::rms_norm(x, w, 1e-6f);
    const Tensor y_plain = ops::rms_norm(x, Tensor(), 1e-5f);
    for (int64_t r = 0; r < 15; ++r) {
      double ms = 0;
      for (int64_t i = 0; i < h; ++i) ms += std::pow(x.data<float>()[r * h + i], 2.0);
      ms /= static_cast<double>(h);
      for (int64_t i = 0; i < h; ++i) {
        const double xi = x.data<float>()[r * h + i];
        ASSERT_NEAR(y.data<float>()[r * h + i], xi / std::sqrt(ms + 1e-6) * w.data<float>()[i], 2e-5) << h;
        ASSERT_NEAR(y_plain.data<float>()[r * h + i], xi / std::sqrt(ms + 1e-5), 2e-5) << h;
      }
    }
  }
}

TEST(VectorOps, ActivationsMatchDefinitions) {
  const Tensor x = random_tensor({7, 129}, 3, 6.0f);
  const auto definition = [](const std::string& name, double v) {
    if (name == "relu") return v > 0 ? v : 0.0;
    if (name == "silu" || name == "swish") return v / (1 + std::exp(-v));
    if (name == "gelu") return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    return 0.5 * v * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));  // gelu-tanh
  };
  for (const std::string name : {"relu", "silu", "swish", "gelu", "gelu-tanh"}) {
    const Tensor y = ops::activation(x, ops::get_activation_layer(name));
    for (int64_t i = 0; i < x.numel(); ++i)
      ASSERT_NEAR(y.data<float>()[i], definition(name, x.data<float>()[i]), 1e-5) << name << " at " << i;
  }
  try {
    ops::get_activation_layer("tanhh");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown activation 'tanhh' (expected one of: relu, silu"), std::string::npos);
  }
}

TEST(VectorOps, SoftmaxMatchesDefinitionAndIsStable) {
  Tensor x = random_tensor({5, 33}, 4, 20.0f);
  x.mutable_data<float>()[0] = 1000.0f;  // would overflow exp() without the max shift
  const Tensor y = ops::softmax(x);
  for (int64_t r = 0; r < 5; ++r) {
    double max = -1e30, sum = 0;
    for (int64_t i = 0; i < 33; ++i) max = std::max(max, double(x.data<float>()[r * 33 + i]));
    for (int64_t i = 0; i < 33; ++i) sum += std::exp(x.data<float>()[r * 33 + i] - max);
    for (int64_t i = 0; i < 33; ++i)
      ASSERT_NEAR(y.data<float>()[r * 33 + i], std::exp(x.data<float>()[r * 33 + i] - max) / sum, 1e-6);
  }
}

TEST(VectorOps, ErrorsNameTheOpAndTheShapes) {
  const Tensor x = random_tensor({4, 8}, 5);
  try {
    ops::rms_norm(x, random_tensor({7}, 6));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rms_norm: weight must have shape [H]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::softmax(x.transpose(0, 1)), Error);
  EXPECT_THROW(ops::rms_norm(x, Tensor(), 0.0f), Error);
}

}  // namespace
}  // namespace cubevec
