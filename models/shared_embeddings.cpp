#include "models/shared_embeddings.h"

#include <cmath>

#include "base/error.h"
#include "tensor/half.h"

namespace cubevec::models {

RopeTable axial_rope(const Tensor& ids, const std::vector<int64_t>& axes_dims, double theta) {
  const Tensor ids2 = ids.dim() == 3 ? ids.select(0, 0) : ids;
  if (ids2.dim() != 2 || ids2.size(1) != static_cast<int64_t>(axes_dims.size()))
    throw Error("axial_rope: ids must be [L, " + std::to_string(axes_dims.size()) + "], got " + shape_to_string(ids.shape()));
  // Positions as f32 (diffusers casts the ids to float), whatever integer or float type they came in.
  const Tensor idc = ids2.contiguous();
  std::vector<float> positions(static_cast<std::size_t>(idc.numel()));
  for (std::size_t i = 0; i < positions.size(); ++i) {
    switch (idc.dtype()) {
      case DType::f32: positions[i] = idc.data<float>()[i]; break;
      case DType::i64: positions[i] = static_cast<float>(idc.data<int64_t>()[i]); break;
      case DType::i32: positions[i] = static_cast<float>(idc.data<int32_t>()[i]); break;
      case DType::bf16: positions[i] = bf16_to_f32(idc.data<uint16_t>()[i]); break;
      default: throw Error("axial_rope: ids must be f32, bf16, i32 or i64, got " + std::string(dtype_name(idc.dtype())));
    }
  }
  int64_t head_dim = 0;
  for (int64_t d : axes_dims) head_dim += d;
  const int64_t len = ids2.size(0);
  std::vector<float> cos(static_cast<std::size_t>(len * head_dim)), sin(cos.size());
  const float* pos = positions.data();
  for (int64_t i = 0; i < len; ++i) {
    int64_t col = 0;
    for (std::size_t axis = 0; axis < axes_dims.size(); ++axis) {
      const int64_t d = axes_dims[axis];
      for (int64_t j = 0; j < d / 2; ++j) {
        const double omega = 1.0 / std::pow(theta, static_cast<double>(2 * j) / static_cast<double>(d));
        const double angle = static_cast<double>(pos[i * static_cast<int64_t>(axes_dims.size()) + static_cast<int64_t>(axis)]) * omega;
        for (int r = 0; r < 2; ++r) {
          cos[static_cast<std::size_t>(i * head_dim + col + 2 * j + r)] = static_cast<float>(std::cos(angle));
          sin[static_cast<std::size_t>(i * head_dim + col + 2 * j + r)] = static_cast<float>(std::sin(angle));
        }
      }
      col += d;
    }
  }
  return {Tensor::from_vector(cos, {len, head_dim}), Tensor::from_vector(sin, {len, head_dim})};
}

Tensor timestep_sinusoid(const Tensor& values, int64_t channels, float multiplier) {
  if (values.dim() != 1) throw Error("timestep_sinusoid: expected a 1-D tensor of values, got " + shape_to_string(values.shape()));
  // A small host tensor even in simulate mode: the pipeline makes it, nothing on the device writes it.
  const Tensor v = values.contiguous();
  const int64_t batch = v.size(0), half = channels / 2;
  std::vector<float> out(static_cast<std::size_t>(batch * channels), 0.0f);
  const auto log_period = static_cast<float>(std::log(10000.0));
  for (int64_t b = 0; b < batch; ++b) {
    float t = 0;
    switch (v.dtype()) {
      case DType::f32: t = v.data<float>()[b]; break;
      case DType::bf16: t = bf16_to_f32(v.data<uint16_t>()[b]); break;
      case DType::i64: t = static_cast<float>(v.data<int64_t>()[b]); break;
      default: throw Error("timestep_sinusoid: values must be f32, bf16 or i64, got " + std::string(dtype_name(v.dtype())));
    }
    t *= multiplier;
    for (int64_t j = 0; j < half; ++j) {
      // f32 exponent and argument as diffusers computes them; exp, cos and sin correctly rounded
      // (through double), where torch's own f32 exp can be an ulp off.
      const float exponent = (-log_period * static_cast<float>(j)) / static_cast<float>(half);
      const auto freq = static_cast<float>(std::exp(static_cast<double>(exponent)));
      const float a = t * freq;
      out[static_cast<std::size_t>(b * channels + j)] = static_cast<float>(std::cos(static_cast<double>(a)));
      out[static_cast<std::size_t>(b * channels + half + j)] = static_cast<float>(std::sin(static_cast<double>(a)));
    }
  }
  return Tensor::from_vector(out, {batch, channels});
}

RopeTable RopeCache::get(const std::vector<float>& key, const std::function<RopeTable()>& make) const {
  std::lock_guard lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->first == key) {
      entries_.splice(entries_.begin(), entries_, it);
      return entries_.front().second;
    }
  entries_.emplace_front(key, make());
  ++builds_;
  if (entries_.size() > capacity_) entries_.pop_back();
  return entries_.front().second;
}

std::size_t RopeCache::builds() const {
  std::lock_guard lock(mutex_);
  return builds_;
}

std::vector<float> rope_key(const Tensor& ids) {
  const Tensor c = ids.contiguous();
  std::vector<float> key;
  key.reserve(static_cast<std::size_t>(c.numel()) + c.shape().size());
  for (int64_t d : c.shape()) key.push_back(static_cast<float>(d));
  for (int64_t i = 0; i < c.numel(); ++i) {
    switch (c.dtype()) {
      case DType::f32: key.push_back(c.data<float>()[i]); break;
      case DType::i64: key.push_back(static_cast<float>(c.data<int64_t>()[i])); break;
      case DType::i32: key.push_back(static_cast<float>(c.data<int32_t>()[i])); break;
      case DType::bf16: key.push_back(bf16_to_f32(c.data<uint16_t>()[i])); break;
      default: throw Error("rope ids must be f32, bf16, i32 or i64, got " + std::string(dtype_name(c.dtype())));
    }
  }
  return key;
}

}  // namespace cubevec::models
