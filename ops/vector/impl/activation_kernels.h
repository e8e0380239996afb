// Elementwise activations in branch-free float math (vectorizable; no library calls).
// Included only by ops/vector/isa_*.cpp (see load_store.h on linkage).
#pragma once

#include "ops/vector/impl/load_store.h"
#include "ops/vector_math.h"

namespace cubevec::ops::vk {
namespace {

// erfc(z) for z >= 0 with relative error below 1.3e-7 (Chebyshev-fitted exponent of
// t = 1 / (1 + z / 2), the classic erfcc form), evaluated in float.
inline float erfc_nonneg(float z) {
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  return t * vmath::exp(p - z * z);
}

// Exact GELU: x * Phi(x) = x / 2 * erfc(-x / sqrt 2), from erfc of |x| / sqrt 2 on either side.
inline float gelu_erf(float x) {
  const float e = erfc_nonneg(abs_f(x) * 0.70710678118654752f);
  return 0.5f * x * (x >= 0 ? 2.0f - e : e);
}

// Mish: x * tanh(softplus(x)) = x * n / (n + 2) with n = e^x (e^x + 2); past x = 20 the ratio is 1.
inline float mish(float x) {
  const float e = vmath::exp(min_f(x, 20.0f));
  const float n = e * (e + 2.0f);
  return x * n / (n + 2.0f);
}

inline float gelu_fast(float x) {
  const float ax = abs_f(x);
  return x / (1.0f + vmath::exp(-1.702f * ax)) * vmath::exp(0.851f * (x - ax));
}

template <ActKind K>
inline float activate(float x) {
  if constexpr (K == ActKind::relu) return x > 0.0f ? x : 0.0f;
  else if constexpr (K == ActKind::silu) return vmath::silu(x);
  else if constexpr (K == ActKind::mish) return mish(x);
  else if constexpr (K == ActKind::gelu) return gelu_erf(x);
  else if constexpr (K == ActKind::gelu_tanh) return vmath::gelu_tanh(x);
  else return gelu_fast(x);
}

template <class T, ActKind K>
void unary_range(const UnaryArgs& a, int64_t i0, int64_t i1) {
  const T* __restrict x = static_cast<const T*>(a.x);
  T* __restrict out = static_cast<T*>(a.out);
  for (int64_t i = i0; i < i1; ++i) store(out, i, activate<K>(load(x, i)));
}

template <class T>
void unary_range(const UnaryArgs& a, int64_t i0, int64_t i1) {
  switch (a.kind) {
    case ActKind::relu: return unary_range<T, ActKind::relu>(a, i0, i1);
    case ActKind::silu: return unary_range<T, ActKind::silu>(a, i0, i1);
    case ActKind::mish: return unary_range<T, ActKind::mish>(a, i0, i1);
    case ActKind::gelu: return unary_range<T, ActKind::gelu>(a, i0, i1);
    case ActKind::gelu_tanh: return unary_range<T, ActKind::gelu_tanh>(a, i0, i1);
    case ActKind::gelu_fast: return unary_range<T, ActKind::gelu_fast>(a, i0, i1);
  }
}

}  // namespace
}  // namespace cubevec::ops::vk
