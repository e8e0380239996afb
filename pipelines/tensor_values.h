// Small host-side tensor helpers the pipelines and their stages share (one definition each: a unity
// batch may put two of their files in one translation unit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ops/vector_ops.h"
#include "tensor/tensor.h"

namespace cubevec::pipelines {

// A 1-D f32 tensor of n copies of value (timesteps, guidance, VAE scaling factors).
inline Tensor filled(int64_t n, float value) { return Tensor::from_vector(std::vector<float>(static_cast<std::size_t>(n), value), {n}); }

// A tensor's values as doubles, whatever its dtype (the step caches' similarity measures).
inline std::vector<double> host_values(const Tensor& t) {
  const Tensor c = ops::cast(t, DType::f32).contiguous();
  const float* p = c.data<float>();
  return std::vector<double>(p, p + c.numel());
}

}  // namespace cubevec::pipelines
