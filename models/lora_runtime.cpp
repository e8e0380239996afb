#include "models/lora_runtime.h"

#include <algorithm>
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

// [out, rank] -> [rank, out]
Tensor transposed(const Tensor& f32) {
  const int64_t rows = f32.size(0), cols = f32.size(1);
  Tensor out = Tensor::empty({cols, rows}, DType::f32);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out.mutable_data<float>()[j * rows + i] = f32.data<float>()[i * cols + j];
  return out;
}

// Rows of `parts` one after the other (each [r_i, n]).
Tensor stacked(const std::vector<Tensor>& parts) {
  int64_t rows = 0;
  for (const Tensor& p : parts) rows += p.size(0);
  Tensor out = Tensor::empty({rows, parts.front().size(1)}, DType::f32);
  float* dst = out.mutable_data<float>();
  for (const Tensor& p : parts) dst = std::copy(p.data<float>(), p.data<float>() + p.numel(), dst);
  return out;
}

Tensor as_dtype(const Tensor& t, DType dtype, const Stream& stream) { return t.dtype() == dtype ? t : ops::cast(t, dtype, stream); }

}  // namespace

void RuntimeLora::add(const std::vector<LoraDelta>& deltas) {
  for (const LoraDelta& d : deltas) {
    Delta delta;
    LayerDeltas& layer = by_layer_[d.layer];
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
      layer.has_bias = true;
    }
    layer.deltas.push_back(std::move(delta));
    // The stacked matrices of every low-rank delta of the layer so far.
    std::vector<Tensor> downs, ups;
    for (const Delta& each : layer.deltas)
      if (each.down_f32.defined()) {
        downs.push_back(each.down_f32);
        ups.push_back(transposed(each.up));
      }
    if (!downs.empty()) {
      layer.down_f32 = stacked(downs);
      layer.down_bf16 = to_bf16(layer.down_f32);
      layer.up_t = stacked(ups);
    }
  }
}

Tensor RuntimeLora::call(const Linear& layer, const Tensor& x, const Stream& stream, const ops::MatmulOptions& epilogue) const {
  const auto it = by_layer_.find(&layer);
  if (it == by_layer_.end()) return {};
  if (x.size(-1) != layer.in) return {};  // the layer's own call names the shape error
  if (layer.kernel || it->second.has_bias) return general_path(layer, it->second, x, stream, epilogue);
  // x A^T (in x's precision, summed in f32), then the layer's GEMM adds (x A^T)(factor B)^T to its
  // tiles before the activation.
  const int64_t rows = x.numel() / layer.in;
  const Tensor x2 = (x.is_contiguous() ? x : ops::contiguous(x, stream)).reshape({rows, layer.in});
  ops::MatmulOptions down;
  down.b_is_weight = true;
  down.compute = x.dtype();
  ops::MatmulOptions own = epilogue;
  own.low_rank_a = ops::matmul(x2, x.dtype() == DType::bf16 ? it->second.down_bf16 : it->second.down_f32, down, stream);
  own.low_rank_b = it->second.up_t;
  return layer.own_forward(x, stream, own);
}

Tensor RuntimeLora::general_path(const Linear& layer, const LayerDeltas& deltas, const Tensor& x, const Stream& stream,
                                 const ops::MatmulOptions& epilogue) const {
  const DType dtype = x.dtype();
  const int64_t rows = x.numel() / layer.in;
  const Tensor x2 = (x.is_contiguous() ? x : ops::contiguous(x, stream)).reshape({rows, layer.in});
  // Without an activation the delta folds into what the layer's GEMM adds to its product:
  //   y = residual + gate (x W^T + b + d) = [residual + gate d] + gate (x W^T + b),
  // so each delta's second GEMM takes the running sum as its residual and the layer's gate as its
  // own. Under an activation the sum goes in unactivated and the epilogue follows.
  const bool activated = epilogue.activation != ops::GemmActivation::none;
  Tensor d = activated || !epilogue.residual.defined() ? Tensor() : epilogue.residual.reshape({rows, layer.out});
  const Tensor gate = activated ? Tensor() : epilogue.gate;
  for (const Delta& delta : deltas.deltas) {
    if (!delta.up.defined()) {  // a bias difference alone (Wan's diff_b without a LoRA)
      Tensor row = (dtype == DType::bf16 ? delta.bias_bf16 : delta.bias_f32).reshape({1, layer.out});
      if (gate.defined()) row = ops::mul(row, as_dtype(gate.reshape({1, layer.out}), dtype, stream), stream);
      d = d.defined() ? ops::add(as_dtype(d, dtype, stream), row, stream) : ops::add(Tensor::zeros({rows, layer.out}, dtype), row, stream);
      continue;
    }
    ops::MatmulOptions down;
    down.b_is_weight = true;
    down.compute = dtype;
    const Tensor t = ops::matmul(x2, dtype == DType::bf16 ? delta.down_bf16 : delta.down_f32, down, stream);
    ops::MatmulOptions up;
    up.b_is_weight = true;
    up.out = dtype;
    up.bias = delta.bias_f32;
    if (d.defined()) {
      up.residual = d.is_contiguous() ? d : ops::contiguous(d, stream);
      up.gate = gate;
    } else if (gate.defined()) {
      up.residual = Tensor::zeros({rows, layer.out}, dtype);
      up.gate = gate;
    }
    d = ops::matmul(t, delta.up, up, stream);
  }
  ops::MatmulOptions own = epilogue;
  own.residual = d;
  if (!activated) return layer.own_forward(x, stream, own);
  own.activation = ops::GemmActivation::none;
  own.gate = {};
  Tensor y = layer.own_forward(x, stream, own);
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
