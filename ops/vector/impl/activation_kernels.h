// Elementwise activations in branch-free float math (vectorizable; no library calls).
// Included only by ops/vector/isa_*.cpp (see load_store.h on linkage).
#pragma once

#include "ops/vector/impl/load_store.h"
#include "ops/vector_math.h"

namespace cubevec::ops::vk {
namespace {

// Exact GELU: x * Phi(x) = x / 2 * (1 + erf(x / sqrt 2)), erf by an odd/even rational fit on
// [-4, 4] (outside it erf is +-1 in float); absolute error of erf about 1e-7, so GELU is within
// 1e-7 relative for x >= 0 and 1e-7 |x| absolute below.
[[gnu::always_inline]] inline float gelu_erf(float x) {
  float z = x * 0.70710678118654752f;
  z = max_f(min_f(z, 4.0f), -4.0f);
  const float z2 = z * z;
  float p = -2.72614225801306e-10f;
  p = p * z2 + 2.77068142495902e-08f;
  p = p * z2 - 2.10102402082508e-06f;
  p = p * z2 - 5.69250639462346e-05f;
  p = p * z2 - 7.34990630326855e-04f;
  p = p * z2 - 2.95459980854025e-03f;
  p = p * z2 - 1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * z2 - 2.13374055278905e-04f;
  q = q * z2 - 1.68282697438203e-03f;
  q = q * z2 - 7.37332916720468e-03f;
  q = q * z2 - 1.42647390514189e-02f;
  const float erf = z * p / q;
  return 0.5f * x * (1.0f + erf);
}

// Mish: x * tanh(softplus(x)) = x * n / (n + 2) with n = e^x (e^x + 2); past x = 20 the ratio is 1.
[[gnu::always_inline]] inline float mish(float x) {
  const float e = vmath::exp(min_f(x, 20.0f));
  const float n = e * (e + 2.0f);
  return x * n / (n + 2.0f);
}

[[gnu::always_inline]] inline float gelu_fast(float x) {
  const float ax = abs_f(x);
  return x / (1.0f + vmath::exp(-1.702f * ax)) * vmath::exp(0.851f * (x - ax));
}

template <ActKind K>
[[gnu::always_inline]] inline float activate(float x) {
  if constexpr (K == ActKind::relu) return x < 0.0f ? 0.0f : x;  // NaN stays NaN, as torch.relu
  else if constexpr (K == ActKind::silu) return vmath::silu(x);
  else if constexpr (K == ActKind::mish) return mish(x);
  else if constexpr (K == ActKind::gelu) return gelu_erf(x);
  else if constexpr (K == ActKind::gelu_tanh) return vmath::gelu_tanh(x);
  else return gelu_fast(x);
}

// bf16 goes through an f32 block so the transcendental loop runs on plain floats.
template <class T, ActKind K>
void unary_range(const UnaryArgs& a, int64_t i0, int64_t i1) {
  const T* __restrict x = static_cast<const T*>(a.x);
  T* __restrict out = static_cast<T*>(a.out);
  if constexpr (__is_same(T, float) || K == ActKind::relu) {
    CUBEVEC_NO_ALIAS
    for (int64_t i = i0; i < i1; ++i) store(out, i, activate<K>(load(x, i)));
  } else {
    constexpr int64_t kBlock = 1024;
    float buf[kBlock];
    for (int64_t i = i0; i < i1; i += kBlock) {
      const int64_t len = i1 - i < kBlock ? i1 - i : kBlock;
      const T* __restrict xb = x + i;
      T* __restrict ob = out + i;
      for (int64_t j = 0; j < len; ++j) buf[j] = activate<K>(load(xb, j));
      for (int64_t j = 0; j < len; ++j) store(ob, j, buf[j]);
    }
  }
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
