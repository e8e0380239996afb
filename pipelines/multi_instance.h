// Multi-instance serving on one device: N instances of a model, each with its own Cube and Vector
// streams and its own activations, sharing one read-only copy of the weights.
//
// The model is a small MLP, `layers` x (h = gelu_tanh(rms_norm(h) W_l + b_l)): GEMMs on the Cube
// unit, norms and activations on the Vector unit, so instances can fill each other's idle unit.
#pragma once

#include <vector>

#include "device/device.h"

namespace cubevec {

struct MlpWeights {
  int64_t width = 0;
  std::vector<Tensor> weights;  // [width, width] each, frozen storage
  std::vector<Tensor> biases;   // [width] each, frozen storage
};

MlpWeights make_mlp_weights(int layers, int64_t width, unsigned seed);

// One instance's forward pass on its streams (x: [tokens, width]).
Tensor mlp_forward(const MlpWeights& model, const Tensor& x, const Stream& cube, const Stream& vector);

struct InstancesRun {
  double wall_s = 0;
  std::vector<Tensor> outputs;  // one per input, in input order
};

// Serves one request per input. concurrent: every instance on its own stream pair, all in flight
// together; otherwise one after another on a single stream pair, each finished before the next.
InstancesRun run_instances(Device& device, const MlpWeights& model, const std::vector<Tensor>& inputs, bool concurrent);

}  // namespace cubevec
