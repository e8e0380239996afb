#include "quant/calibration.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/error.h"
#include "tensor/half.h"

namespace cubevec::quant {

namespace {

constexpr float kEps = std::numeric_limits<float>::epsilon();

std::vector<float> host_f32(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<float> v(static_cast<std::size_t>(c.numel()));
  if (c.dtype() == DType::f32) std::copy_n(c.data<float>(), v.size(), v.begin());
  else if (c.dtype() == DType::bf16) convert_bf16_to_f32(c.data<uint16_t>(), v.data(), v.size());
  else throw Error("quantize_layer: weights must be f32 or bf16, got " + std::string(dtype_name(c.dtype())));
  return v;
}

}  // namespace

std::pair<float, float> activation_qparams(const ActivationRange& range) {
  const float lo = std::min(range.min, 0.0f), hi = std::max(range.max, 0.0f);
  const float scale = std::max(hi / 255.0f - lo / 255.0f, kEps);
  const float offset = std::nearbyint(-lo / scale) - 128.0f;
  return {scale, std::clamp(offset, -128.0f, 127.0f)};
}

QuantTensors quantize_layer(const Tensor& weight, const Tensor& bias, Algorithm algorithm, const std::vector<ActivationRange>& ranges) {
  if (!weight.defined() || weight.dim() != 2) throw Error("quantize_layer: expected a weight [out, in]");
  const int64_t out = weight.size(0), in = weight.size(1);
  const std::vector<float> w = host_f32(weight);
  std::vector<int8_t> wq(static_cast<std::size_t>(out * in));
  std::vector<float> w_scale(static_cast<std::size_t>(out));
  std::vector<int64_t> row_sums(static_cast<std::size_t>(out), 0);
  for (int64_t r = 0; r < out; ++r) {
    float amax = 0;
    for (int64_t c = 0; c < in; ++c) amax = std::max(amax, std::abs(w[static_cast<std::size_t>(r * in + c)]));
    const float s = std::max(amax / 127.0f, kEps);
    w_scale[static_cast<std::size_t>(r)] = s;
    for (int64_t c = 0; c < in; ++c) {
      const auto q = static_cast<int8_t>(std::clamp(std::nearbyint(w[static_cast<std::size_t>(r * in + c)] / s), -128.0f, 127.0f));
      wq[static_cast<std::size_t>(r * in + c)] = q;
      row_sums[static_cast<std::size_t>(r)] += q;
    }
  }
  const std::vector<float> b = bias.defined() ? host_f32(bias) : std::vector<float>(static_cast<std::size_t>(out), 0.0f);
  QuantTensors t;
  t.weight = Tensor::from_vector(wq, {out, in});
  t.weight_scale = Tensor::from_vector(w_scale, {out});
  if (bias.defined()) t.bias = Tensor::from_vector(b, {out});
  if (algorithm != Algorithm::w8a8 && algorithm != Algorithm::w8a8_timestep) return t;
  const bool stacked = algorithm == Algorithm::w8a8_timestep;
  if (ranges.empty() || (!stacked && ranges.size() != 1))
    throw Error("quantize_layer: " + std::string(algorithm_name(algorithm)) + " needs " +
                (stacked ? "one activation range per step" : "one activation range"));
  const auto rows = static_cast<int64_t>(ranges.size());
  std::vector<float> scales, offsets, deq;
  std::vector<int32_t> qbias;
  for (const ActivationRange& range : ranges) {
    const auto [scale, offset] = activation_qparams(range);
    scales.push_back(scale), offsets.push_back(offset);
    for (int64_t r = 0; r < out; ++r) {
      const float d = scale * w_scale[static_cast<std::size_t>(r)];
      deq.push_back(d);
      const float corrected = b[static_cast<std::size_t>(r)] / d - offset * static_cast<float>(row_sums[static_cast<std::size_t>(r)]);
      qbias.push_back(static_cast<int32_t>(std::nearbyint(corrected)));
    }
  }
  t.input_scale = Tensor::from_vector(scales, {rows});
  t.input_offset = Tensor::from_vector(offsets, {rows});
  t.deq_scale = stacked ? Tensor::from_vector(deq, {rows, out}) : Tensor::from_vector(deq, {out});
  t.quant_bias = stacked ? Tensor::from_vector(qbias, {rows, out}) : Tensor::from_vector(qbias, {out});
  if (!stacked) t.bias = Tensor();
  return t;
}

}  // namespace cubevec::quant
