// The quantization parameters msModelSlim computes (calculate_int_qparam; see docs/stages.md,
// "msModelSlim's quantization parameters"), from a float Linear and the activation ranges
// calibration observed:
//   weights      symmetric per output channel: s = max(|W_o| / 127, eps), W_q = clamp(rint(W / s), -128, 127)
//   activations  asymmetric per tensor: min <= 0 <= max, scale = max(max / 255 - min / 255, eps),
//                offset = rint(-min / scale) - 128
//   static       deq_scale = input_scale * s_o, quant_bias = rint(bias / deq_scale - offset * sum_k W_q[o, k])
// eps is float32's epsilon, as msModelSlim's.
#pragma once

#include <utility>
#include <vector>

#include "quant/schemes.h"

namespace cubevec::quant {

struct ActivationRange {
  float min = 0, max = 0;
};

// (scale, offset) of the static activation quantization for `range`.
std::pair<float, float> activation_qparams(const ActivationRange& range);

// The tensors of `algorithm` for a float Linear (weight [out, in] f32 or bf16, bias [out] or
// undefined): `ranges` holds one range for W8A8, one per step for W8A8_TIMESTEP, none otherwise.
// For W8A8 the bias is folded into quant_bias and `bias` comes back undefined (MindIE's static
// layer adds no float bias); W8A8_TIMESTEP keeps it for its dynamic steps.
QuantTensors quantize_layer(const Tensor& weight, const Tensor& bias, Algorithm algorithm, const std::vector<ActivationRange>& ranges);

}  // namespace cubevec::quant
