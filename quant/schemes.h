// MindIE SD's quantized Linear schemes with its arithmetic (mindiesd/quantization/layer.py, read
// with the CANN operators it calls; the details in docs/stages.md, "MindIE SD's quantization files
// and schemes"):
//   W8A16          y = x (W_int8 * weight_scale[o])^T + bias           (float activations)
//   W8A8_DYNAMIC   s_m = max|x_m| / 127, q = rint(x / s_m);   y = (q W^T) * weight_scale[o] * s_m + bias
//   W8A8 (static)  q = clamp(rint(x / input_scale + input_offset), -128, 127);
//                  y = (q W^T + quant_bias[o]) * deq_scale[o]       (the float bias is folded into quant_bias)
//   W8A8_TIMESTEP  the static tensors with a leading step dimension; the timestep policy picks static
//                  (row `step`) or dynamic per denoising step
// with SmoothQuant's x * mul_scale before any activation quantization. Weights are int8 [out, in]
// and stay int8 in memory (packed once for the int8 GEMM; W8A16 is widened while packing each
// call), so no float copy is kept. Each forward takes the Linear's fused epilogue (activation,
// gated residual, output dtype).
#pragma once

#include <memory>
#include <string>

#include "ops/gemm.h"
#include "ops/quantized.h"
#include "quant/algorithm.h"
#include "quant/timestep_policy.h"

namespace cubevec::quant {

class QuantizedLinear {
 public:
  virtual ~QuantizedLinear() = default;
  virtual Algorithm algorithm() const = 0;
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  // x [rows, in] (f32 or bf16, contiguous) -> [rows, out] in epilogue.out, with epilogue's
  // activation, residual and gate fused (its bias, b_is_weight and compute fields are ignored).
  // `step`: the denoising step (timestep-aware schemes), from 0.
  virtual Tensor forward(const Tensor& x, const ops::MatmulOptions& epilogue, int step, const Stream& stream) const = 0;
  virtual std::size_t weight_bytes() const = 0;   // int8 data, scales and biases held
  virtual int static_steps() const { return 0; }  // W8A8_TIMESTEP: the steps with static scales

 protected:
  QuantizedLinear(int64_t in, int64_t out) : in_(in), out_(out) {}
  int64_t in_, out_;
};

// The tensors of one layer as MindIE's files hold them (undefined where the scheme has none).
struct QuantTensors {
  Tensor weight;        // i8 [out, in]
  Tensor weight_scale;  // f32 [out]
  Tensor bias;          // f32 [out]
  Tensor mul_scale;     // f32 [in] (SmoothQuant)
  // static (and, with a leading [T] dim, timestep-aware)
  Tensor input_scale, input_offset;  // f32 [1] or [T]
  Tensor deq_scale;                  // f32 [out] or [T, out] (int64 files decoded by the reader)
  Tensor quant_bias;                 // i32 [out] or [T, out]
};

// Builds the scheme from its tensors (checked: dtypes and shapes against in / out; an Error
// naming `what` otherwise). `policy` is needed for W8A8_TIMESTEP.
std::unique_ptr<QuantizedLinear> make_quantized_linear(Algorithm algorithm, int64_t in, int64_t out, const QuantTensors& tensors,
                                                       std::shared_ptr<const TimestepPolicy> policy, const std::string& what);

}  // namespace cubevec::quant
