// Compiled with -mavx512f -mavx512bw -mavx512vl -mfma -ffp-contract=off (see ops/CMakeLists.txt); called only on CPUs
// with AVX-512.
#include <immintrin.h>

// GCC 12's own AVX-512 intrinsics (max, roundscale, scalef, the reductions, ...) pass
// _mm512_undefined_ps() (or its 256-bit kin) as the unused merge source, which -Wmaybe-uninitialized
// or, once inlined into a loop, -Wuninitialized reports at every use: a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "ops/attention/tile_kernels.h"

namespace cubevec::ops::attn {

namespace {

constexpr int MR = gemm::kMrAvx512;

// W = 16 * NV columns of O for MR rows; the accumulators are MR * NV zmm registers.
template <int NV>
[[gnu::always_inline]] inline void pv_tile(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha) {
  __m512 acc[MR][NV];
  if (alpha) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 2
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_mul_ps(a, _mm512_loadu_ps(o + r * ldo + 16 * c));
    }
  } else {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < kc; ++k) {
    __m512 b[NV];
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) b[c] = _mm512_loadu_ps(v + 16 * c);
      // Row r of P sits at the fixed distance r * kBlockKeys from row 0: one base register for all.
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * kBlockKeys + k]);
#pragma GCC unroll 2
      for (int c = 0; c < NV; ++c) acc[r][c] = _mm512_fmadd_ps(pr, b[c], acc[r][c]);
    }
    v += 16 * NV;
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + r * ldo + 16 * c, acc[r][c]);
}

// exp(x) for x <= 0 (the softmax only needs that range): Cody-Waite reduction, degree-6 Taylor
// polynomial, 2^n applied by scalef (about 2 ulp, the same scheme as ops/vector_math.h). A NaN x
// gives NaN (max returns its second operand when either is NaN), as a NaN score must.
[[gnu::always_inline]] inline __m512 exp_nonpositive(__m512 x) {
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
// values, so the normalization cancels any common factor. y is clamped at -200, where 2^y is
// exactly 0 in f32, so y = -inf gives 0; max returns its second operand when either is NaN, so a
// NaN y gives NaN.
[[gnu::always_inline]] inline __m512 exp2_for_bf16(__m512 y) {
  y = _mm512_max_ps(_mm512_set1_ps(-200.0f), y);
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(y, n);
  __m512 p = _mm512_set1_ps(0.05517168715596199f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2426111400127411f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6932609677314758f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999280571937561f));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 first_lanes(int count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (count > 0 ? count : 0)) - 1u);
}

}  // namespace

void pv_avx512_w32(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha) {
  pv_tile<2>(kc, p, v, o, ldo, alpha);
}

void pv_avx512_w16(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha) {
  pv_tile<1>(kc, p, v, o, ldo, alpha);
}

namespace {

// One row's step. kForBf16P: the probabilities will be rounded to bf16 (flash_bf16, flash_int8),
// so the cheaper exp2_for_bf16 is exact enough; otherwise exp_nonpositive (about 2 ulp).
template <bool kForBf16P>
void softmax_row(const SoftmaxTile& t, int r) {
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

// A whole key block with no mask, bias or prefix and a positive scale (a DiT's self-attention),
// for bf16 P: each row's max is taken on its raw scores (a positive scale keeps the order) and the
// exp scales as it goes: y = (x - raw max) scale log2(e) + (raw max scale - m) log2(e), so S is
// read twice and written once. Subtracting in raw units first keeps y exactly 0 at the block's max
// and the rounding of y relative to |x - max|, whatever the scores' size (a form that scaled x and
// m separately lost y to their rounding past scores of about 1e6, and gave NaN or 0 for all-equal
// scores of 3e9). All rows' maxima come first and the sums are trees, so the rows' short dependency
// chains overlap. A row whose max is not finite takes softmax_row; a NaN score the max dropped still
// gives a NaN P and row sum here, as in softmax_row.
void softmax_full_block_for_bf16(const SoftmaxTile& t) {
  constexpr int kVectors = kBlockKeys / 16;
  constexpr int kMaxRows = 64;
  float raw_max[kMaxRows], scaled_max[kMaxRows], m_new[kMaxRows];
  bool fused[kMaxRows];
  for (int r = 0; r < t.rows; ++r) {
    const float* s = t.s + r * kBlockKeys;
    __m512 v[kVectors];
#pragma GCC unroll 8
    for (int i = 0; i < kVectors; ++i) v[i] = _mm512_loadu_ps(s + 16 * i);
    for (int w = kVectors / 2; w > 0; w /= 2)
#pragma GCC unroll 4
      for (int i = 0; i < w; ++i) v[i] = _mm512_max_ps(v[i + w], v[i]);  // a NaN may or may not reach the max: see above
    raw_max[r] = _mm512_reduce_max_ps(v[0]);
    scaled_max[r] = raw_max[r] * t.scale;
    m_new[r] = scaled_max[r] > t.m[r] ? scaled_max[r] : t.m[r];
    // Finite maxima only (false for inf and NaN): then x - raw max is never inf - inf.
    fused[r] = __builtin_fabsf(raw_max[r]) <= __FLT_MAX__ && __builtin_fabsf(scaled_max[r]) <= __FLT_MAX__;
  }
  const __m512 vscale_log2e = _mm512_set1_ps(t.scale * 1.44269504088896341f);
  for (int r = 0; r < t.rows; ++r) {
    if (!fused[r]) {
      softmax_row<true>(t, r);
      continue;
    }
    float* s = t.s + r * kBlockKeys;
    const __m512 vraw_max = _mm512_set1_ps(raw_max[r]);
    // 0 in the block holding the running max; else the gap to it, <= 0 (-inf when it overflows).
    // From the rounded scaled max: raw_max * scale - m_new contracted into an FMA would leave the
    // product's rounding error as y (this file is compiled with -ffp-contract=off for that).
    const __m512 voffset = _mm512_set1_ps((scaled_max[r] - m_new[r]) * 1.44269504088896341f);
    __m512 p[kVectors];
#pragma GCC unroll 8
    for (int i = 0; i < kVectors; ++i) {
      const __m512 gap = _mm512_sub_ps(_mm512_loadu_ps(s + 16 * i), vraw_max);
      p[i] = exp2_for_bf16(_mm512_fmadd_ps(gap, vscale_log2e, voffset));
      _mm512_storeu_ps(s + 16 * i, p[i]);
    }
    for (int w = kVectors / 2; w > 0; w /= 2)
#pragma GCC unroll 4
      for (int i = 0; i < w; ++i) p[i] = _mm512_add_ps(p[i], p[i + w]);
    const float m_old = t.m[r];
    const float alpha = m_old == -__builtin_inff() ? 0.0f : _mm512_cvtss_f32(exp_nonpositive(_mm512_set1_ps(m_old - m_new[r])));
    t.alpha[r] = alpha;
    t.m[r] = m_new[r];
    t.l[r] = t.l[r] * alpha + _mm512_reduce_add_ps(p[0]);
  }
}

}  // namespace

void softmax_tile_avx512(const SoftmaxTile& t) {
  for (int r = 0; r < t.rows; ++r) softmax_row<false>(t, r);
}

void softmax_tile_avx512_bf16p(const SoftmaxTile& t) {
  if (t.cols == kBlockKeys && !t.row_cols && !t.mask && !t.bias && t.scale > 0.0f && t.rows <= 64) {
    softmax_full_block_for_bf16(t);
    return;
  }
  for (int r = 0; r < t.rows; ++r) softmax_row<true>(t, r);
}

}  // namespace cubevec::ops::attn
