#include "pipelines/multi_instance.h"

#include <chrono>
#include <random>

#include "ops/gemm.h"
#include "ops/vector_ops.h"

namespace cubevec {

namespace {

Tensor frozen_random(const Shape& shape, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> values(static_cast<std::size_t>(shape_numel(shape)));
  for (float& v : values) v = dist(rng);
  Tensor t = Tensor::from_vector(values, shape);
  t.storage()->freeze();
  return t;
}

}  // namespace

MlpWeights make_mlp_weights(int layers, int64_t width, unsigned seed) {
  if (layers < 1 || width < 1) throw Error("make_mlp_weights: layers and width must be at least 1");
  std::mt19937 rng(seed);
  MlpWeights model;
  model.width = width;
  const float scale = 1.0f / std::sqrt(static_cast<float>(width));
  for (int l = 0; l < layers; ++l) {
    model.weights.push_back(frozen_random({width, width}, rng, scale));
    model.biases.push_back(frozen_random({width}, rng, 0.1f));
  }
  return model;
}

Tensor mlp_forward(const MlpWeights& model, const Tensor& x, const Stream& cube, const Stream& vector) {
  if (x.dim() != 2 || x.size(1) != model.width)
    throw Error("mlp_forward: expected input [tokens, " + std::to_string(model.width) + "], got " + shape_to_string(x.shape()));
  Tensor h = x;
  for (std::size_t l = 0; l < model.weights.size(); ++l) {
    const Tensor normed = ops::rms_norm(h, {}, 1e-6f, vector);
    const Tensor projected = ops::matmul(normed, model.weights[l], {.bias = model.biases[l]}, cube);
    h = ops::activation(projected, ops::Activation::gelu_tanh, vector);
  }
  return h;
}

InstancesRun run_instances(Device& device, const MlpWeights& model, const std::vector<Tensor>& inputs, bool concurrent) {
  std::vector<std::pair<Stream, Stream>> streams;
  for (std::size_t i = 0; i < (concurrent ? inputs.size() : 1); ++i) {
    const std::string tag = concurrent ? "instance " + std::to_string(i) : "sequential";
    streams.emplace_back(device.new_stream(tag + " cube"), device.new_stream(tag + " vector"));
  }
  InstancesRun run;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto& [cube, vector] = streams[concurrent ? i : 0];
    run.outputs.push_back(mlp_forward(model, inputs[i], cube, vector));
    if (!concurrent) vector.synchronize();  // this instance is done before the next starts
  }
  device.synchronize();
  run.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return run;
}

}  // namespace cubevec
