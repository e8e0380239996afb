#include "ops/vector_ops.h"

#include <cmath>
#include <tbb/parallel_for.h>

namespace cubevec::ops {

namespace {

// Launches `row_kernel(in_row, out_row, width)` over every row of x's last dimension.
template <class RowKernel>
Tensor launch_rowwise(const char* name, const Tensor& x, const std::vector<Tensor>& extra_reads, double flops_per_element,
                      const Stream& stream, RowKernel row_kernel) {
  require_contiguous_f32(x, name, "x");
  if (x.dim() == 0) throw Error(std::string(name) + ": x must have at least one dimension, got a scalar");
  const int64_t width = x.size(-1);
  const int64_t rows = width == 0 ? 0 : x.numel() / width;
  Tensor out = stream.device().empty(x.shape(), DType::f32, stream);
  std::vector<Tensor> reads = extra_reads;
  reads.push_back(x);
  const auto n = static_cast<double>(x.numel());
  stream.launch({name, Unit::vector, flops_per_element * n, 8.0 * n, DType::f32}, reads, {out},
                [x, out, rows, width, row_kernel] {
                  const auto* in = reinterpret_cast<const float*>(x.unsynchronized_data_ptr());
                  auto* o = reinterpret_cast<float*>(out.unsynchronized_data_ptr());
                  tbb::parallel_for(int64_t{0}, rows, [&](int64_t r) { row_kernel(in + r * width, o + r * width, width); });
                });
  return out;
}

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, const Stream& stream) {
  std::vector<Tensor> reads;
  if (weight.defined()) {
    require_contiguous_f32(weight, "rms_norm", "weight");
    if (x.dim() == 0 || weight.shape() != Shape{x.size(-1)})
      throw Error("rms_norm: weight must have shape [H] with H the last size of x " + shape_to_string(x.shape()) +
                  ", got " + shape_to_string(weight.shape()));
    reads.push_back(weight);
  }
  if (!(eps > 0)) throw Error("rms_norm: eps must be positive, got " + std::to_string(eps));
  return launch_rowwise("rms_norm", x, reads, 4.0, stream, [weight, eps](const float* in, float* out, int64_t h) {
    const float* scale = weight.defined() ? reinterpret_cast<const float*>(weight.unsynchronized_data_ptr()) : nullptr;
    float sum = 0;
    for (int64_t i = 0; i < h; ++i) sum += in[i] * in[i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(h) + eps);
    if (scale)
      for (int64_t i = 0; i < h; ++i) out[i] = in[i] * inv * scale[i];
    else
      for (int64_t i = 0; i < h; ++i) out[i] = in[i] * inv;
  });
}

Activation get_activation_layer(std::string_view name) {
  if (name == "relu") return Activation::relu;
  if (name == "silu" || name == "swish") return Activation::silu;
  if (name == "gelu") return Activation::gelu;
  if (name == "gelu-tanh") return Activation::gelu_tanh;
  throw Error("unknown activation '" + std::string(name) + "' (expected one of: relu, silu, swish, gelu, gelu-tanh)");
}

float activation_reference(Activation kind, float x) {
  switch (kind) {
    case Activation::relu: return x > 0 ? x : 0.0f;
    case Activation::silu: return x / (1.0f + std::exp(-x));
    case Activation::gelu: return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case Activation::gelu_tanh:
      return 0.5f * x * (1.0f + std::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  }
  return x;
}

Tensor activation(const Tensor& x, Activation kind, const Stream& stream) {
  static const char* names[] = {"relu", "silu", "mish", "gelu", "gelu_tanh", "gelu_fast"};
  return launch_rowwise(names[static_cast<int>(kind)], x, {}, 8.0, stream, [kind](const float* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = activation_reference(kind, in[i]);
  });
}

Tensor softmax(const Tensor& x, const Stream& stream) {
  return launch_rowwise("softmax", x, {}, 5.0, stream, [](const float* in, float* out, int64_t n) {
    if (n == 0) return;
    float max = in[0];
    for (int64_t i = 1; i < n; ++i) max = std::max(max, in[i]);
    float sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += (out[i] = std::exp(in[i] - max));
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; ++i) out[i] *= inv;
  });
}

}  // namespace cubevec::ops
