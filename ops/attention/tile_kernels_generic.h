// Plain-loop tile kernels for the portable build (compiled at the x86-64 baseline; everything here
// has internal linkage for the reason ops/vector_math.h gives).
#pragma once

#include "ops/attention/tile_kernels.h"
#include "ops/vector_math.h"

namespace cubevec::ops::attn {
namespace {

template <int MR, int W>
void pv_generic(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha) {
  float acc[MR][W];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < W; ++c) acc[r][c] = alpha ? alpha[r] * o[r * ldo + c] : 0.0f;
  for (int64_t k = 0; k < kc; ++k, v += W)
    for (int r = 0; r < MR; ++r) {
      const float pr = p[r * kBlockKeys + k];
      for (int c = 0; c < W; ++c) acc[r][c] += pr * v[c];
    }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < W; ++c) o[r * ldo + c] = acc[r][c];
}

// The same online-softmax update as softmax_tile_avx512 (see tile_kernels.h), one element at a time.
void softmax_generic(const SoftmaxTile& t) {
  const float neg_inf = -__builtin_inff();
  for (int r = 0; r < t.rows; ++r) {
    float* s = t.s + r * kBlockKeys;
    int n = t.row_cols ? t.row_cols[r] : t.cols;
    n = n < 0 ? 0 : (n > t.cols ? t.cols : n);
    const uint8_t* mask = (t.mask && r < t.mask_rows) ? t.mask + r * t.mask_ld : nullptr;
    const float* bias = (t.bias && r < t.bias_rows) ? t.bias + r * t.bias_ld : nullptr;
    float row_max = neg_inf;
    for (int j = 0; j < t.cols; ++j) {
      const bool attend = j < n && (!mask || mask[j] != 0);
      s[j] = attend ? (bias ? s[j] * t.scale + bias[j] : s[j] * t.scale) : neg_inf;
      row_max = s[j] > row_max ? s[j] : row_max;
    }
    const float m_old = t.m[r];
    const float m_new = row_max > m_old ? row_max : m_old;
    if (m_new == neg_inf) {
      for (int j = 0; j < t.cols; ++j) s[j] = 0.0f;
      t.alpha[r] = 1.0f;
      continue;
    }
    float sum = 0.0f;
    for (int j = 0; j < t.cols; ++j) {
      s[j] = s[j] == neg_inf ? 0.0f : vmath::exp(s[j] - m_new);
      sum += s[j];
    }
    const float alpha = m_old == neg_inf ? 0.0f : vmath::exp(m_old - m_new);
    t.alpha[r] = alpha;
    t.m[r] = m_new;
    t.l[r] = t.l[r] * alpha + sum;
  }
}

}  // namespace
}  // namespace cubevec::ops::attn
