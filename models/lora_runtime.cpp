#include "models/lora_runtime.h"

#include <utility>

#include "ops/vector_ops.h"
#include "tensor/half.h"

namespace cubevec::models {

namespace {

Tensor to_bf16(const Tensor& f32) {
  Tensor out = Tensor::empty(f32.shape(), DType::bf16);
  convert_f32_to_bf16(f32.data<float>(), out.mutable_data<uint16_t>(), static_cast<std::size_t>(f32.numel()));
  return out;
}

Tensor scaled(const Tensor& f32, double factor) {
  Tensor out = Tensor::empty(f32.shape(), DType::f32);
  for (int64_t i = 0; i < f32.numel(); ++i) out.mutable_data<float>()[i] = static_cast<float>(factor * f32.data<float>()[i]);
  return out;
}

Tensor as_dtype(const Tensor& t, DType dtype, const Stream& stream) { return t.dtype() == dtype ? t : ops::cast(t, dtype, stream); }

}  // namespace

void RuntimeLora::add(const std::vector<LoraDelta>& deltas) {
  for (const LoraDelta& d : deltas) {
    Delta delta;
    if (d.down.defined()) {
      delta.down_f32 = d.down.contiguous();
      delta.down_bf16 = to_bf16(delta.down_f32);
      delta.up = scaled(d.up.contiguous(), d.factor);
      total_rank_ += d.down.size(0);
      macs_per_row_ += static_cast<double>(d.down.size(0) * (d.layer->in + d.layer->out));
    }
    if (d.bias.defined()) {
      delta.bias_f32 = scaled(d.bias.contiguous(), d.bias_factor);
      delta.bias_bf16 = to_bf16(delta.bias_f32);
    }
    by_layer_[d.layer].push_back(std::move(delta));
  }
}

Tensor RuntimeLora::call(const Linear& layer, const Tensor& x, const Stream& stream, const ops::MatmulOptions& epilogue) const {
  const auto it = by_layer_.find(&layer);
  if (it == by_layer_.end()) return {};
  if (x.size(-1) != layer.in) return {};  // the layer's own call names the shape error
  const DType dtype = x.dtype();
  const int64_t rows = x.numel() / layer.in;
  const Tensor x2 = (x.is_contiguous() ? x : ops::contiguous(x, stream)).reshape({rows, layer.in});
  // d = sum of the deltas, [rows, out] in x's dtype: (x A^T) in f32, then (x A^T) (factor B)^T with
  // the bias difference and the deltas before it as the second GEMM's bias and residual.
  Tensor d;
  for (const Delta& delta : it->second) {
    const Tensor& bias = dtype == DType::bf16 ? delta.bias_bf16 : delta.bias_f32;
    if (!delta.up.defined()) {
      const Tensor row = bias.reshape({1, layer.out});
      d = d.defined() ? ops::add(d, row, stream) : ops::add(Tensor::zeros({rows, layer.out}, dtype), row, stream);
      continue;
    }
    ops::MatmulOptions down;
    down.b_is_weight = true;
    down.compute = dtype == DType::bf16 ? DType::bf16 : DType::f32;
    const Tensor t = ops::matmul(x2, dtype == DType::bf16 ? delta.down_bf16 : delta.down_f32, down, stream);
    ops::MatmulOptions up;
    up.b_is_weight = true;
    up.out = dtype;
    up.bias = delta.bias_f32;
    up.residual = d;
    d = ops::matmul(t, delta.up, up, stream);
  }
  ops::MatmulOptions own = epilogue;
  const bool plain = epilogue.activation == ops::GemmActivation::none && !epilogue.gate.defined();
  if (plain) {
    // y = x W^T + b + d (+ residual): the delta rides in the GEMM's residual.
    own.residual =
        epilogue.residual.defined() ? ops::add(as_dtype(epilogue.residual.reshape({rows, layer.out}), dtype, stream), d, stream) : d;
    return layer.own_forward(x, stream, own);
  }
  // y = residual + gate * act(x W^T + b + d): the delta before the activation, then the epilogue.
  own.activation = ops::GemmActivation::none;
  own.gate = {};
  own.residual = d;
  Tensor y = layer.own_forward(x, stream, own);
  if (epilogue.activation != ops::GemmActivation::none)
    y = ops::activation(y, epilogue.activation == ops::GemmActivation::silu ? ops::Activation::silu : ops::Activation::gelu_tanh, stream);
  if (epilogue.gate.defined()) y = ops::mul(y, as_dtype(epilogue.gate, y.dtype(), stream), stream);
  if (epilogue.residual.defined()) y = ops::add(as_dtype(epilogue.residual.reshape(y.shape()), y.dtype(), stream), y, stream);
  return y;
}

RuntimeLoraScope::RuntimeLoraScope(const RuntimeLora* lora) : previous_(current_linear_call_hook()) {
  if (lora && !lora->empty()) set_linear_call_hook(lora);
}

RuntimeLoraScope::~RuntimeLoraScope() { set_linear_call_hook(previous_); }

}  // namespace cubevec::models
