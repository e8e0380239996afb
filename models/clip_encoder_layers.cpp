#include "models/clip_encoder_layers.h"

#include "base/error.h"
#include "ops/attention.h"

namespace cubevec::models {

ops::Activation clip_activation(const std::string& hidden_act) {
  if (hidden_act == "quick_gelu") return ops::Activation::gelu_fast;  // gelu_fast = x sigmoid(1.702 x)
  if (hidden_act == "gelu") return ops::Activation::gelu;
  throw Error("hidden_act '" + hidden_act + "' is not one CLIP's encoder runs (quick_gelu or gelu)");
}

void ClipEncoderLayer::declare(ParameterTable& table, const std::string& prefix, int64_t hidden_size, int64_t intermediate_size) {
  const int64_t e = hidden_size;
  ln1_weight.declare(table, prefix + "layer_norm1.weight", e);
  ln1_bias.declare(table, prefix + "layer_norm1.bias", e);
  q.declare(table, prefix + "self_attn.q_proj", e, e);
  k.declare(table, prefix + "self_attn.k_proj", e, e);
  v.declare(table, prefix + "self_attn.v_proj", e, e);
  out.declare(table, prefix + "self_attn.out_proj", e, e);
  ln2_weight.declare(table, prefix + "layer_norm2.weight", e);
  ln2_bias.declare(table, prefix + "layer_norm2.bias", e);
  fc1.declare(table, prefix + "mlp.fc1", e, intermediate_size);
  fc2.declare(table, prefix + "mlp.fc2", intermediate_size, e);
}

Tensor ClipEncoderLayer::forward(const Tensor& x, const ClipLayerSettings& settings, const Stream& stream) const {
  ops::AttentionOptions attention;
  attention.layout = ops::AttentionLayout::bsh;
  attention.num_heads = settings.num_heads;
  attention.mask = settings.mask;
  const float eps = settings.layer_norm_eps;
  const Tensor h = ops::fast_layernorm(x, ln1_weight.value, ln1_bias.value, eps, ops::LayerNormImpl::high_precision, stream).out;
  const Tensor a = ops::attention_forward(q(h, stream), k(h, stream), v(h, stream), attention, stream);
  const Tensor y = out(a, stream, {.residual = x});
  const Tensor h2 = ops::fast_layernorm(y, ln2_weight.value, ln2_bias.value, eps, ops::LayerNormImpl::high_precision, stream).out;
  return fc2(ops::activation(fc1(h2, stream), settings.activation, stream), stream, {.residual = y});
}

}  // namespace cubevec::models
