// Quantized kernels: activation quantization on the Vector unit and the int8 GEMM on the Cube unit,
// as MindIE SD's quantized Linears run them on an NPU (npu_dynamic_quant / npu_quantize, then
// npu_quant_matmul with its dequant epilogue). The schemes built from them are in quant/.
#pragma once

#include <memory>

#include "ops/gemm.h"
#include "ops/gemm/int8.h"
#include "ops/op_stream.h"

namespace cubevec::ops {

// Activations as the int8 GEMM reads them.
struct QuantizedActivations {
  Tensor data;       // u8 [M, K_padded]: q (s8) + 128, padding 128
  Tensor row_scale;  // f32 [M]: dynamic, the per-token scale; static, 1 (NaN for a row with a non-finite value)
  int64_t k = 0;     // the real K
};

struct ActivationQuant {
  bool dynamic = true;          // per-token symmetric (max|x| / 127), else static per-tensor:
  float scale = 1, offset = 0;  // q = clamp(rint(x / scale + offset), -128, 127)
  Tensor mul_scale{};           // [K] f32: SmoothQuant's x * mul_scale before quantizing, or undefined
};

// x [M, K] (or [..., K]: flattened rows) f32 or bf16, any strides -> quantized rows padded to
// `k_padded` (>= K, a multiple of 4: the packed weight's). Runs on the Vector unit.
QuantizedActivations quantize_activations(const Tensor& x, int64_t k_padded, const ActivationQuant& quant,
                                          const Stream& stream = default_op_stream());

using PackedInt8Weight = std::shared_ptr<const gemm::PackedInt8>;
// W [N, K] i8 (contiguous) packed once for the int8 kernel the calibration chose for `threads` Cube
// threads (0: the calling arena's; gemm::chosen_int8_isa).
PackedInt8Weight pack_int8_weight(const Tensor& weight, int threads = 0);

struct Int8MatmulOptions {
  Tensor int_bias{};   // i32 [N], added to the integer sums (static W8A8's quant_bias)
  Tensor col_scale{};  // f32 [N] (per-channel weight scale, or static W8A8's deq_scale)
  Tensor bias{};       // f32 [N], added after scaling
  GemmActivation activation = GemmActivation::none;
  Tensor residual{};  // [M, N] f32 or bf16
  Tensor gate{};      // f32 [N]; needs residual
  DType out = DType::f32;
};

// y [M, N] = ((a x W^T) + int_bias) * row_scale * col_scale + bias, then the activation, the
// (gated) residual, in `out`. Runs on the Cube unit.
Tensor matmul_int8(const QuantizedActivations& a, const PackedInt8Weight& w, const Int8MatmulOptions& options = {},
                   const Stream& stream = default_op_stream());

// The two above as one Cube kernel: x [..., K] (f32 or bf16, any strides) is quantized as
// `quant` says block by block while the GEMM packs A (no pass of its own over the activations);
// the result equals matmul_int8(quantize_activations(x, ...), w, options) bit for bit, shaped
// [..., N].
Tensor matmul_int8_quantizing(const Tensor& x, const ActivationQuant& quant, const PackedInt8Weight& w,
                              const Int8MatmulOptions& options = {}, const Stream& stream = default_op_stream());

}  // namespace cubevec::ops
