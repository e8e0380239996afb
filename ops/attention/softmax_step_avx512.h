// The pieces of the AVX-512 flash tiles' online-softmax step that both of its kernels use
// (tile_kernels_avx512.cpp: the accurate step of f32 flash; tile_kernels_avx512_bf16p.cpp: the step
// for bf16 P): the two exps and the general per-row step. Included only by files compiled for
// AVX-512 (with -ffp-contract=off: see softmax_full_block in the bf16 file); `static` keeps each
// copy private to its file.
#pragma once

#include <immintrin.h>

#include "ops/attention/tile_kernels.h"

namespace cubevec::ops::attn {

// exp(x) for x <= 0 (the softmax only needs that range): Cody-Waite reduction, degree-6 Taylor
// polynomial, 2^n applied by scalef (about 2 ulp, the same scheme as ops/vector_math.h). A NaN x
// gives NaN (max returns its second operand when either is NaN), as a NaN score must.
[[gnu::always_inline]] static inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-87.3f), x);
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// 2^y for y <= 0 (up to rounding), for a softmax whose P is then rounded to bf16 (8 significant
// bits, relative rounding error up to 2^-9): 2^n 2^f with n = round(y), |f| <= 1/2, and 2^f by a
// degree-3 polynomial fitted to the relative error (at most 7.5e-5, 4% of bf16's rounding; fit by
// tools/exp2_poly_fit.py). Half the operations of exp_nonpositive. The row sum takes the same
// values, so the normalization cancels any common factor. Unclamped: any finite y gives its value,
// y = -inf gives NaN (-inf - -inf, then scalef(NaN, -inf), NaN as Intel documents it; Zen 4
// returns 0), which the caller must catch. The subtraction is an FMA: on Zen 4 the FMA pipes run
// only FMAs and products while the other two run adds, maxima, rounding, scalef (at half rate) and
// conversions, and the bf16 softmax is bound by the latter.
[[gnu::always_inline]] static inline __m512 exp2_for_bf16_unclamped(__m512 y) {
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.0f), y);  // y - n, exactly
  __m512 p = _mm512_set1_ps(0.05517168715596199f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2426111400127411f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6932609677314758f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999280571937561f));
  return _mm512_scalef_ps(p, n);
}

// The same clamped at -200, where 2^y is exactly 0 in f32, so y = -inf gives 0; max returns its
// second operand when either is NaN, so a NaN y gives NaN.
[[gnu::always_inline]] static inline __m512 exp2_for_bf16(__m512 y) {
  return exp2_for_bf16_unclamped(_mm512_max_ps(_mm512_set1_ps(-200.0f), y));
}

static inline __mmask16 first_lanes(int count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (count > 0 ? count : 0)) - 1u);
}

// One row's step. kForBf16P: the probabilities will be rounded to bf16 (flash_bf16, flash_int8),
// so the cheaper exp2_for_bf16 is exact enough; otherwise exp_nonpositive (about 2 ulp).
template <bool kForBf16P>
static inline void softmax_row(const SoftmaxTile& t, int r) {
  const float neg_inf = -__builtin_inff();
  const __m512 vneg_inf = _mm512_set1_ps(neg_inf), vscale = _mm512_set1_ps(t.scale);
  float* s = t.s + r * kBlockKeys;
  int n = t.row_cols ? t.row_cols[r] : t.cols;
  n = n < 0 ? 0 : (n > t.cols ? t.cols : n);
  const uint8_t* mask = (t.mask && r < t.mask_rows) ? t.mask + r * t.mask_ld : nullptr;
  const float* bias = (t.bias && r < t.bias_rows) ? t.bias + r * t.bias_ld : nullptr;
  // Pass 1: scaled scores (plus the bias), -inf where the key is masked out or beyond the row's prefix; row max.
  __m512 vmax = vneg_inf;
  for (int j = 0; j < t.cols; j += 16) {
    const __mmask16 in_block = first_lanes(t.cols - j);
    __mmask16 attend = first_lanes(n - j);
    if (mask) {
      const __m128i bytes = _mm_maskz_loadu_epi8(in_block, mask + j);
      attend &= _mm_test_epi8_mask(bytes, bytes);
    }
    __m512 x = _mm512_mask_mul_ps(vneg_inf, attend, _mm512_maskz_loadu_ps(in_block, s + j), vscale);
    if (bias) x = _mm512_mask_add_ps(x, attend, x, _mm512_maskz_loadu_ps(in_block, bias + j));
    _mm512_mask_storeu_ps(s + j, in_block, x);
    vmax = _mm512_max_ps(vmax, x);
  }
  const float m_old = t.m[r];
  const float row_max = _mm512_reduce_max_ps(vmax);
  const float m_new = row_max > m_old ? row_max : m_old;
  if (m_new == neg_inf) {  // nothing to attend to yet: P = 0, O and the sum stay as they are
    for (int j = 0; j < t.cols; j += 16) _mm512_mask_storeu_ps(s + j, first_lanes(t.cols - j), _mm512_setzero_ps());
    t.alpha[r] = 1.0f;
    return;
  }
  // Pass 2: P = exp(x - m_new), exactly 0 where x is -inf (NaN stays NaN); row sum.
  const __m512 vm = _mm512_set1_ps(m_new);
  __m512 vsum = _mm512_setzero_ps();
  for (int j = 0; j < t.cols; j += 16) {
    const __mmask16 in_block = first_lanes(t.cols - j);
    __m512 p;
    if constexpr (kForBf16P) {  // lanes past the block read as -inf, which the exp takes to 0
      const __m512 x = _mm512_mask_loadu_ps(vneg_inf, in_block, s + j);
      p = exp2_for_bf16(_mm512_mul_ps(_mm512_sub_ps(x, vm), _mm512_set1_ps(1.44269504088896341f)));
    } else {  // unordered compare: a NaN x is kept
      const __m512 x = _mm512_maskz_loadu_ps(in_block, s + j);
      const __mmask16 finite = _mm512_mask_cmp_ps_mask(in_block, x, vneg_inf, _CMP_NEQ_UQ);
      p = _mm512_maskz_mov_ps(finite, exp_nonpositive(_mm512_sub_ps(x, vm)));
    }
    _mm512_mask_storeu_ps(s + j, in_block, p);
    vsum = _mm512_add_ps(vsum, p);
  }
  const float alpha = m_old == neg_inf ? 0.0f : _mm512_cvtss_f32(exp_nonpositive(_mm512_set1_ps(m_old - m_new)));
  t.alpha[r] = alpha;
  t.m[r] = m_new;
  t.l[r] = t.l[r] * alpha + _mm512_reduce_add_ps(vsum);
}

}  // namespace cubevec::ops::attn
