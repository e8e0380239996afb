// Row kernels of RMSNorm, LayerNorm (with AdaLN's scale and shift), GroupNorm and softmax.
// Included only by ops/vector/isa_*.cpp (see load_store.h on linkage).
#pragma once

#include "ops/vector/impl/load_store.h"
#include "ops/vector_math.h"

namespace cubevec::ops::vk {
namespace {

// bf16 rows that fit are converted into an f32 buffer once, then read as f32.
constexpr int64_t kRowBuffer = 4096;

template <class T>
void rms_norm_rows(const RowArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.width;
  const float* __restrict w = a.weight;
  const float inv_n = 1.0f / static_cast<float>(n);
  float buffer[kRowBuffer];
  const auto row = [&](const auto* __restrict x, T* __restrict out) __attribute__((always_inline)) {
    const float ms = reduce_sum(x, n, [](float v) { return v * v; }) * inv_n;
    const float inv = 1.0f / sqrt_f(ms + a.eps);
    if (w) {
      CUBEVEC_NO_ALIAS
      for (int64_t i = 0; i < n; ++i) store(out, i, load(x, i) * inv * w[i]);
    } else {
      CUBEVEC_NO_ALIAS
      for (int64_t i = 0; i < n; ++i) store(out, i, load(x, i) * inv);
    }
  };
  for (int64_t r = r0; r < r1; ++r) {
    const T* __restrict x = static_cast<const T*>(a.x) + r * n;
    T* __restrict out = static_cast<T*>(a.out) + r * n;
    if (n <= kRowBuffer) row(as_f32(x, n, buffer), out);
    else row(x, out);
  }
}

// kWeight / kBias: affine parameters present; P: AdaLN's scale/shift storage (void: none).
template <class T, class P, bool kWeight, bool kBias>
void layer_norm_rows_impl(const RowArgs& a, int64_t r0, int64_t r1) {
  constexpr bool kAda = !__is_same(P, void);
  const int64_t n = a.width;
  const float* __restrict w = a.weight;
  const float* __restrict b = a.bias;
  const float inv_n = 1.0f / static_cast<float>(n);
  float buffer[kRowBuffer];
  const auto row = [&](int64_t r, const auto* __restrict x, T* __restrict out) __attribute__((always_inline)) {
    const float mean = reduce_sum(x, n, [](float v) { return v; }) * inv_n;
    const float var = reduce_sum(x, n, [mean](float v) { return (v - mean) * (v - mean); }) * inv_n;
    const float rstd = 1.0f / sqrt_f(var + a.eps);
    if (a.mean) a.mean[r] = mean;
    if (a.rstd) a.rstd[r] = rstd;
    if constexpr (kAda) {
      const int64_t p = r / a.param_div;
      const P* __restrict scale = static_cast<const P*>(a.scale) + p * n;
      const P* __restrict shift = static_cast<const P*>(a.shift) + p * n;
      CUBEVEC_NO_ALIAS
      for (int64_t i = 0; i < n; ++i) {
        float v = (load(x, i) - mean) * rstd;
        if constexpr (kWeight) v *= w[i];
        if constexpr (kBias) v += b[i];
        store(out, i, v * (1.0f + load(scale, i)) + load(shift, i));
      }
    } else {
      CUBEVEC_NO_ALIAS
      for (int64_t i = 0; i < n; ++i) {
        float v = (load(x, i) - mean) * rstd;
        if constexpr (kWeight) v *= w[i];
        if constexpr (kBias) v += b[i];
        store(out, i, v);
      }
    }
  };
  for (int64_t r = r0; r < r1; ++r) {
    const T* __restrict x = static_cast<const T*>(a.x) + r * n;
    T* __restrict out = static_cast<T*>(a.out) + r * n;
    if (n <= kRowBuffer) row(r, as_f32(x, n, buffer), out);
    else row(r, x, out);
  }
}

template <class T, class P>
void layer_norm_rows(const RowArgs& a, int64_t r0, int64_t r1) {
  if (a.weight && a.bias) layer_norm_rows_impl<T, P, true, true>(a, r0, r1);
  else if (a.weight) layer_norm_rows_impl<T, P, true, false>(a, r0, r1);
  else if (a.bias) layer_norm_rows_impl<T, P, false, true>(a, r0, r1);
  else layer_norm_rows_impl<T, P, false, false>(a, r0, r1);
}

template <class T>
void layer_norm_rows(const RowArgs& a, int64_t r0, int64_t r1) {
  if (!a.scale) layer_norm_rows<T, void>(a, r0, r1);
  else if (a.param_type == Elem::f32) layer_norm_rows<T, float>(a, r0, r1);
  else layer_norm_rows<T, bf16_t>(a, r0, r1);
}

// Softmax of each row, shifted by the row's max: bf16 rows are first converted into an f32
// buffer (when they fit; else read twice); then the max, exp() into the output (f32) or the buffer
// (bf16, in place), its sum, and one scaling pass, each a simple loop that vectorizes.
template <class T>
void softmax_rows(const RowArgs& a, int64_t r0, int64_t r1) {
  constexpr int64_t kBuffer = 4096;
  float buffer[kBuffer];
  const int64_t n = a.width;
  for (int64_t r = r0; r < r1; ++r) {
    const T* __restrict x = static_cast<const T*>(a.x) + r * n;
    T* __restrict out = static_cast<T*>(a.out) + r * n;
    if (__is_same(T, float) || n <= kBuffer) {
      if constexpr (__is_same(T, float)) {
        const float max = reduce_max(x, n);
        CUBEVEC_NO_ALIAS
        for (int64_t i = 0; i < n; ++i) out[i] = vmath::exp(x[i] - max);
        const float inv = 1.0f / reduce_sum(static_cast<const float*>(out), n, [](float v) { return v; });
        for (int64_t i = 0; i < n; ++i) out[i] *= inv;
      } else {
        for (int64_t i = 0; i < n; ++i) buffer[i] = load(x, i);
        const float max = reduce_max(static_cast<const float*>(buffer), n);
        for (int64_t i = 0; i < n; ++i) buffer[i] = vmath::exp(buffer[i] - max);
        const float inv = 1.0f / reduce_sum(static_cast<const float*>(buffer), n, [](float v) { return v; });
        for (int64_t i = 0; i < n; ++i) store(out, i, buffer[i] * inv);
      }
    } else {
      const float max = reduce_max(x, n);
      const float inv = 1.0f / reduce_sum(x, n, [max](float v) { return vmath::exp(v - max); });
      for (int64_t i = 0; i < n; ++i) store(out, i, vmath::exp(load(x, i) - max) * inv);
    }
  }
}

// GroupNorm: statistics of each group in one pass (sums shifted by the group's first value, in
// float over blocks and double across them), then one normalizing pass per channel (with the VAE's
// SiLU fused into it when asked: one pass and one tensor fewer).
template <class T>
void group_norm_groups(const GroupNormArgs& a, int64_t g0, int64_t g1) {
  constexpr int64_t kBlock = 4096;
  const int64_t cpg = a.channels_per_group, hw = a.hw, n = cpg * hw;
  for (int64_t g = g0; g < g1; ++g) {
    const T* __restrict x = static_cast<const T*>(a.x) + g * n;
    T* __restrict out = static_cast<T*>(a.out) + g * n;
    const float k = n > 0 ? load(x, 0) : 0.0f;
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t len = n - i < kBlock ? n - i : kBlock;
      const T* __restrict xb = x + i;
      s1 += reduce_sum(xb, len, [k](float v) { return v - k; });
      s2 += reduce_sum(xb, len, [k](float v) { return (v - k) * (v - k); });
    }
    const double mean_shifted = s1 / static_cast<double>(n);
    double var = s2 / static_cast<double>(n) - mean_shifted * mean_shifted;
    var = var > 0 ? var : 0;
    const auto mean = static_cast<float>(mean_shifted + k);
    const float rstd = static_cast<float>(1.0 / __builtin_sqrt(var + static_cast<double>(a.eps)));
    const int64_t c0 = (g % a.groups) * cpg;
    for (int64_t c = 0; c < cpg; ++c) {
      const float w = a.weight ? a.weight[c0 + c] : 1.0f;
      const float scale = rstd * w;
      const float offset = a.bias ? a.bias[c0 + c] : 0.0f;
      const T* __restrict xc = x + c * hw;
      T* __restrict oc = out + c * hw;
      if (a.silu) {
        CUBEVEC_NO_ALIAS
        for (int64_t i = 0; i < hw; ++i) store(oc, i, vmath::silu((load(xc, i) - mean) * scale + offset));
      } else {
        CUBEVEC_NO_ALIAS
        for (int64_t i = 0; i < hw; ++i) store(oc, i, (load(xc, i) - mean) * scale + offset);
      }
    }
  }
}

// normalize_channels: for each column block, the squared norms of its columns summed channel by
// channel (contiguous runs of the block's columns, so the loops vectorize across positions), then
// one scaling pass over the same runs.
template <class T>
void channel_norm_blocks(const ChannelNormArgs& a, int64_t i0, int64_t i1) {
  const int64_t c_count = a.channels, s_count = a.inner, block = a.block;
  const int64_t blocks = (s_count + block - 1) / block;
  float sums[kChannelNormBlock];
  for (int64_t item = i0; item < i1; ++item) {
    const int64_t n = item / blocks, s0 = (item % blocks) * block;
    const int64_t len = s_count - s0 < block ? s_count - s0 : block;
    const T* __restrict x = static_cast<const T*>(a.x) + n * c_count * s_count + s0;
    T* __restrict out = static_cast<T*>(a.out) + n * c_count * s_count + s0;
    for (int64_t i = 0; i < len; ++i) sums[i] = 0.0f;
    for (int64_t c = 0; c < c_count; ++c) {
      const T* __restrict xc = x + c * s_count;
      for (int64_t i = 0; i < len; ++i) {
        const float v = load(xc, i);
        sums[i] += v * v;
      }
    }
    for (int64_t i = 0; i < len; ++i) sums[i] = a.scale / max_f(sqrt_f(sums[i]), a.eps);
    for (int64_t c = 0; c < c_count; ++c) {
      const float w = a.weight ? a.weight[c] : 1.0f;
      const T* __restrict xc = x + c * s_count;
      T* __restrict oc = out + c * s_count;
      if (a.silu) {
        CUBEVEC_NO_ALIAS
        for (int64_t i = 0; i < len; ++i) store(oc, i, vmath::silu(load(xc, i) * sums[i] * w));
      } else {
        CUBEVEC_NO_ALIAS
        for (int64_t i = 0; i < len; ++i) store(oc, i, load(xc, i) * sums[i] * w);
      }
    }
  }
}

}  // namespace
}  // namespace cubevec::ops::vk
