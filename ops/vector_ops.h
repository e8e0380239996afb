// Vector kernels used so far: RMSNorm, activations by name, softmax. Each works on contiguous f32
// tensors, row by row along the last dimension, threaded over rows on the Vector unit.
#pragma once

#include <string_view>

#include "ops/op_stream.h"

namespace cubevec::ops {

// y = x / sqrt(mean(x^2) + eps) * weight, over the last dimension; weight [H] or undefined.
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps = 1e-6f, const Stream& stream = default_op_stream());

enum class Activation { relu, silu, gelu, gelu_tanh };
// Names as MindIE SD's get_activation_layer spells them: "relu", "silu" (also "swish"), "gelu",
// "gelu-tanh". Throws listing the known names.
Activation parse_activation(std::string_view name);
Tensor activation(const Tensor& x, Activation kind, const Stream& stream = default_op_stream());

// Softmax over the last dimension.
Tensor softmax(const Tensor& x, const Stream& stream = default_op_stream());

// Scalar definitions, for reference loops in tests.
float activation_reference(Activation kind, float x);

}  // namespace cubevec::ops
