#include "models/forward_context.h"

#include "ops/attention.h"
#include "ops/vector_ops.h"
#include "base/error.h"

namespace cubevec::models {

Tensor dense_attention(const AttentionQkv& qkv, const Stream& stream) {
  const Tensor o = ops::attention_forward(qkv.q, qkv.k, qkv.v, {}, stream);
  return o.reshape({o.size(0), o.size(1), o.size(2) * o.size(3)});
}

Tensor ForwardContext::rms_norm_across_heads(const Tensor& x, const Tensor& weight, float eps, const Stream& stream) const {
  return tensor ? tensor->rms_norm_across_heads(x, weight, eps, stream) : ops::rms_norm(x, weight, eps, stream);
}

void check_activation_dtype(DType activations) {
  if (activations != DType::f32 && activations != DType::bf16)
    throw Error("the activation dtype must be f32 or bf16, got " + std::string(dtype_name(activations)));
}

}  // namespace cubevec::models
