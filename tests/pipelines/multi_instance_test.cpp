#include "pipelines/multi_instance.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ops/gemm.h"
#include "ops/vector_ops.h"

namespace cubevec {
namespace multi_instance_test {  // named after the file: unity batches never mix two files' helpers

std::vector<Tensor> random_inputs(int count, int64_t tokens, int64_t width) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<Tensor> inputs;
  for (int i = 0; i < count; ++i) {
    std::vector<float> v(static_cast<std::size_t>(tokens * width));
    for (float& x : v) x = dist(rng);
    inputs.push_back(Tensor::from_vector(v, {tokens, width}));
  }
  return inputs;
}

TEST(MultiInstance, ConcurrentInstancesComputeWhatSequentialOnesDo) {
  Device device(builtin_cpu_profile());
  const MlpWeights model = make_mlp_weights(3, 48, 5);
  const auto inputs = random_inputs(4, 20, 48);
  const InstancesRun sequential = run_instances(device, model, inputs, false);
  const InstancesRun concurrent = run_instances(device, model, inputs, true);
  ASSERT_EQ(concurrent.outputs.size(), 4u);
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_EQ(concurrent.outputs[i].shape(), (Shape{20, 48}));
    EXPECT_EQ(std::memcmp(concurrent.outputs[i].data_ptr(), sequential.outputs[i].data_ptr(), concurrent.outputs[i].nbytes()), 0)
        << "instance " << i << " differs between concurrent and sequential serving";
  }
  // Distinct inputs give distinct outputs: the instances did not share activations.
  EXPECT_NE(std::memcmp(concurrent.outputs[0].data_ptr(), concurrent.outputs[1].data_ptr(), concurrent.outputs[0].nbytes()), 0);
}

TEST(MultiInstance, ForwardMatchesTheOpsOnOneStreamAndWeightsAreShared) {
  Device device(builtin_cpu_profile());
  const MlpWeights model = make_mlp_weights(2, 16, 9);
  const auto inputs = random_inputs(1, 5, 16);
  const Stream s = device.new_stream();
  // The model restated with the ops on a single stream.
  Tensor h = inputs[0];
  for (std::size_t l = 0; l < 2; ++l)
    h = ops::activation(
        ops::matmul(ops::rms_norm(h, {}, 1e-6f, s), model.weights[l], {.bias = model.biases[l], .backend = ops::GemmBackend::reference}, s),
        ops::Activation::gelu_tanh, s);
  const Tensor out = mlp_forward(model, inputs[0], device.new_stream(), device.new_stream());
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_NEAR(out.data<float>()[i], h.data<float>()[i], 1e-5) << i;
  for (const Tensor& w : model.weights) EXPECT_TRUE(w.storage()->read_only()) << "weights are frozen";
  Tensor w0 = model.weights[0];
  EXPECT_THROW(w0.mutable_data<float>(), Error);
  EXPECT_THROW(mlp_forward(model, random_inputs(1, 5, 17)[0], s, s), Error);
}

}  // namespace multi_instance_test
}  // namespace cubevec
