// Compiled with -mavx2 -mfma (see ops/CMakeLists.txt); called only on CPUs with AVX2. The same
// steps as tile_kernels_avx512.cpp on 8-lane registers; AVX2 has no mask registers, so a partial
// block of keys goes through a padded copy and masks become lane compares.
#include <immintrin.h>

#include "ops/attention/tile_kernels.h"

namespace cubevec::ops::attn {

namespace {

constexpr int MR = gemm::kMrAvx2;

// W = 8 * NV columns of O for MR rows; the accumulators are MR * NV ymm registers (12 for W = 16).
// Every loop over rows and columns is unrolled: left as loops, GCC 12 keeps the accumulators in
// memory (see ops/gemm/microkernel_avx2.cpp).
template <int NV>
[[gnu::always_inline]] inline void pv_tile(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha) {
  __m256 acc[MR][NV];
  if (alpha) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_set1_ps(alpha[r]);
#pragma GCC unroll 2
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_mul_ps(a, _mm256_loadu_ps(o + r * ldo + 8 * c));
    }
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < kc; ++k) {
    __m256 b[NV];
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) b[c] = _mm256_loadu_ps(v + 8 * c);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 pr = _mm256_broadcast_ss(p + r * kBlockKeys + k);
#pragma GCC unroll 2
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm256_fmadd_ps(pr, b[c], acc[r][c]);
    }
    v += 8 * NV;
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) _mm256_storeu_ps(o + r * ldo + 8 * c, acc[r][c]);
}

// exp(x) for x <= 0, as tile_kernels_avx512.cpp computes it; 2^n is built in the exponent bits
// (x >= -87.3 keeps n >= -126, a normal number). A NaN x gives NaN.
[[gnu::always_inline]] inline __m256 exp_nonpositive(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723e-6f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// Lanes [0, count) all ones, the rest zero.
inline __m256 first_lanes(int count) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(count), index));
}

// Lanes [0, valid) of src and `pad` in the rest: a partial block goes through the aligned scratch
// `tail`, so nothing past the block is read.
inline __m256 load_first(const float* src, int valid, float pad, float* tail) {
  if (valid >= 8) return _mm256_loadu_ps(src);
  for (int i = 0; i < 8; ++i) tail[i] = i < valid ? src[i] : pad;
  return _mm256_load_ps(tail);
}

// Lanes [0, valid) of x into dst, nothing past them.
inline void store_first(float* dst, int valid, __m256 x, float* tail) {
  if (valid >= 8) return _mm256_storeu_ps(dst, x);
  _mm256_store_ps(tail, x);
  for (int i = 0; i < valid; ++i) dst[i] = tail[i];
}

inline float reduce_max(__m256 v) {
  __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_max_ps(x, _mm_movehl_ps(x, x));
  x = _mm_max_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

inline float reduce_add(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

}  // namespace

void pv_avx2_w16(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha) {
  pv_tile<2>(kc, p, v, o, ldo, alpha);
}

void pv_avx2_w8(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha) {
  pv_tile<1>(kc, p, v, o, ldo, alpha);
}

void softmax_tile_avx2(const SoftmaxTile& t) {
  const float neg_inf = -__builtin_inff();
  const __m256 vneg_inf = _mm256_set1_ps(neg_inf), vscale = _mm256_set1_ps(t.scale);
  alignas(32) float tail[8];  // the last, partial block of a row passes through here
  for (int r = 0; r < t.rows; ++r) {
    float* s = t.s + r * kBlockKeys;
    int n = t.row_cols ? t.row_cols[r] : t.cols;
    n = n < 0 ? 0 : (n > t.cols ? t.cols : n);
    const uint8_t* mask = (t.mask && r < t.mask_rows) ? t.mask + r * t.mask_ld : nullptr;
    const float* bias = (t.bias && r < t.bias_rows) ? t.bias + r * t.bias_ld : nullptr;
    // Pass 1: scaled scores (plus the bias), -inf where the key is masked out or beyond the row's
    // prefix (n <= cols, so the lanes past a partial block are -inf too); row max.
    __m256 vmax = vneg_inf;
    for (int j = 0; j < t.cols; j += 8) {
      const int valid = t.cols - j < 8 ? t.cols - j : 8;
      __m256 attend = first_lanes(n - j);
      if (mask) {
        int64_t bytes = 0;
        __builtin_memcpy(&bytes, mask + j, static_cast<unsigned>(valid));
        const __m256i lanes = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes));
        attend = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(lanes, _mm256_setzero_si256())), attend);
      }
      __m256 x = _mm256_mul_ps(load_first(s + j, valid, 0.0f, tail), vscale);
      if (bias) x = _mm256_add_ps(x, load_first(bias + j, valid, 0.0f, tail));
      x = _mm256_blendv_ps(vneg_inf, x, attend);
      store_first(s + j, valid, x, tail);
      vmax = _mm256_max_ps(vmax, x);
    }
    const float m_old = t.m[r];
    const float row_max = reduce_max(vmax);
    const float m_new = row_max > m_old ? row_max : m_old;
    if (m_new == neg_inf) {  // nothing to attend to yet: P = 0, O and the sum stay as they are
      for (int j = 0; j < t.cols; ++j) s[j] = 0.0f;
      t.alpha[r] = 1.0f;
      continue;
    }
    // Pass 2: P = exp(x - m_new), exactly 0 where x is -inf (NaN stays NaN: unordered compare); row sum.
    const __m256 vm = _mm256_set1_ps(m_new);
    __m256 vsum = _mm256_setzero_ps();
    for (int j = 0; j < t.cols; j += 8) {
      const int valid = t.cols - j < 8 ? t.cols - j : 8;
      const __m256 x = load_first(s + j, valid, neg_inf, tail);
      const __m256 p = _mm256_and_ps(_mm256_cmp_ps(x, vneg_inf, _CMP_NEQ_UQ), exp_nonpositive(_mm256_sub_ps(x, vm)));
      store_first(s + j, valid, p, tail);
      vsum = _mm256_add_ps(vsum, p);
    }
    const float alpha = m_old == neg_inf ? 0.0f : _mm256_cvtss_f32(exp_nonpositive(_mm256_set1_ps(m_old - m_new)));
    t.alpha[r] = alpha;
    t.m[r] = m_new;
    t.l[r] = t.l[r] * alpha + reduce_add(vsum);
  }
}

}  // namespace cubevec::ops::attn
