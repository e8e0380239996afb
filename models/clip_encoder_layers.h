// CLIP's encoder layer (transformers' CLIPEncoderLayer), shared by CLIPTextModel and
// CLIPVisionModel: pre-LN, with biases everywhere,
//   x += out_proj(attention(q_proj, k_proj, v_proj of layer_norm1(x)))   scale head_dim^-1/2
//   x += fc2(act(fc1(layer_norm2(x))))       act: quick_gelu (x sigmoid(1.702 x)) or exact gelu
// The text model masks its attention (causal); the vision model does not.
// Weight names under the layer's prefix ("text_model.encoder.layers.<i>."):
// {self_attn.{q,k,v,out}_proj, layer_norm1, layer_norm2, mlp.fc1, mlp.fc2}.{weight,bias}.
#pragma once

#include <cstdint>
#include <string>

#include "device/stream.h"
#include "models/layers.h"
#include "ops/vector_ops.h"
#include "tensor/tensor.h"

namespace cubevec::models {

// CLIP's hidden_act as the fused activation: "quick_gelu" is gelu_fast (x sigmoid(1.702 x)),
// "gelu" the exact erf GELU. The configs check the name; anything else is an Error.
ops::Activation clip_activation(const std::string& hidden_act);

// What every layer of one encoder shares.
struct ClipLayerSettings {
  int64_t num_heads = 1;
  float layer_norm_eps = 1e-5f;
  ops::Activation activation = ops::Activation::gelu_fast;
  Tensor mask;  // boolean [L, L] (true: attend), or undefined for none
};

struct ClipEncoderLayer {
  Vector1d ln1_weight, ln1_bias, ln2_weight, ln2_bias;
  Linear q, k, v, out, fc1, fc2;

  // Declares the layer's weights under `prefix` (ending in '.').
  void declare(ParameterTable& table, const std::string& prefix, int64_t hidden_size, int64_t intermediate_size);
  // x f32 [B, L, hidden_size] -> the layer's output, same shape.
  Tensor forward(const Tensor& x, const ClipLayerSettings& settings, const Stream& stream) const;
};

}  // namespace cubevec::models
