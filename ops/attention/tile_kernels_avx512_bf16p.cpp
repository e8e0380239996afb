// The flash tiles' online-softmax step for a P that is rounded to bf16 before its product
// (flash_bf16 and flash_int8, ops/attention/flash_amx.cpp): the exp at bf16's precision, and P
// written as bf16 straight from the registers that hold it (SoftmaxTile::p_bf16), so the products
// read it as it is. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma
// -ffp-contract=off (see ops/CMakeLists.txt); called only where the CPU has AVX512-BF16 (every CPU
// with AMX-BF16 has it).
#include <immintrin.h>

// GCC 12's own AVX-512 intrinsics (max, roundscale, scalef, the reductions, ...) pass
// _mm512_undefined_ps() (or its 256-bit kin) as the unused merge source, which -Wmaybe-uninitialized
// or, once inlined into a loop, -Wuninitialized reports at every use: a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "ops/attention/softmax_step_avx512.h"
#include "ops/attention/tile_kernels.h"

namespace cubevec::ops::attn {

namespace {

constexpr float kLog2e = 1.44269504088896341f;
constexpr int kVectors = kBlockKeys / 16;  // vectors per row of the tile

// Row r of P (f32, in t.s) to bf16 at t.p_bf16, nearest even; the columns from t.cols up to the
// next multiple of 32 zero.
void store_row_bf16(const SoftmaxTile& t, int r) {
  const float* p = t.s + r * kBlockKeys;
  uint16_t* dst = t.p_bf16 + r * kBlockKeys;
  for (int c = 0; c < t.cols; c += 32) {
    const __m512 lo = _mm512_maskz_loadu_ps(first_lanes(t.cols - c), p + c);
    const __m512 hi = _mm512_maskz_loadu_ps(first_lanes(t.cols - c - 16), p + c + 16);
    _mm512_storeu_si512(dst + c, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
}

// Lane i of the result = op over the 16 lanes of v[i]: sixteen rows reduced together (45
// operations, against 128 for sixteen separate reductions), by halving the lanes that each row
// holds at each level: pairs of rows interleaved, then quads, then the 128-bit lanes.
template <class Op>
[[gnu::always_inline]] inline __m512 reduce_rows(const __m512 (&v)[16], Op op) {
  __m512 pairs[8], quads[4], halves[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) pairs[i] = op(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(pairs[2 * i]), b = _mm512_castps_pd(pairs[2 * i + 1]);
    quads[i] = op(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)
    halves[i] = op(_mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], 0x88), _mm512_shuffle_f32x4(quads[2 * i], quads[2 * i + 1], 0xDD));
  return op(_mm512_shuffle_f32x4(halves[0], halves[1], 0x88), _mm512_shuffle_f32x4(halves[0], halves[1], 0xDD));
}

// A whole key block with no mask, bias or prefix and a positive scale (a DiT's self-attention),
// sixteen rows at a time: each row's max is taken on its raw scores (a positive scale keeps the
// order) and the exp scales as it goes: y = (x - raw max) scale log2(e) + (raw max scale - m)
// log2(e), so S is read twice and P written once. Subtracting in raw units first keeps y exactly 0
// at the block's max and the rounding of y relative to |x - max|, whatever the scores' size (a form
// that scaled x and m separately lost y to their rounding past scores of about 1e6, and gave NaN or
// 0 for all-equal scores of 3e9). The rows' maxima, running state and sums are handled sixteen to a
// vector, so no row waits on its own reductions. A row whose max is not finite takes softmax_row.
// Writing bf16 P, S stays as it was, so a row whose sum came out NaN (a NaN score, or a -inf one
// that the unclamped exp turned into NaN) is done again by softmax_row, which gives it its exact
// zeros and NaNs; writing f32 P into S, the exp is clamped and a NaN score the max dropped gives a
// NaN P and row sum, as in softmax_row.
template <bool kBf16Out>
void softmax_full_block(const SoftmaxTile& t) {
  const __m512 vneg_inf = _mm512_set1_ps(-__builtin_inff()), vflt_max = _mm512_set1_ps(__FLT_MAX__);
  const __m512 vscale_log2e = _mm512_set1_ps(t.scale * kLog2e), one = _mm512_set1_ps(1.0f);
  const auto max = [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); };
  const auto add = [](__m512 a, __m512 b) { return _mm512_add_ps(a, b); };
  for (int r0 = 0; r0 < t.rows; r0 += 16) {
    const int n = t.rows - r0 < 16 ? t.rows - r0 : 16;
    __m512 row_vectors[16];
    for (int i = 0; i < 16; ++i) {
      if (i >= n) {
        row_vectors[i] = vneg_inf;
        continue;
      }
      const float* s = t.s + (r0 + i) * kBlockKeys;
      __m512 v[kVectors];
#pragma GCC unroll 8
      for (int k = 0; k < kVectors; ++k) v[k] = _mm512_loadu_ps(s + 16 * k);
      for (int w = kVectors / 2; w > 0; w /= 2)
#pragma GCC unroll 4
        for (int k = 0; k < w; ++k) v[k] = _mm512_max_ps(v[k + w], v[k]);  // a NaN may or may not reach the max: see above
      row_vectors[i] = v[0];
    }
    const __mmask16 rows = first_lanes(n);
    const __m512 raw_max = reduce_rows(row_vectors, max);
    const __m512 m_old = _mm512_mask_loadu_ps(vneg_inf, rows, t.m + r0);
    const __m512 scaled_max = _mm512_mul_ps(raw_max, _mm512_set1_ps(t.scale));
    const __m512 m_new = _mm512_max_ps(scaled_max, m_old);  // scaled max > m_old ? scaled max : m_old
    // Finite maxima only (inf and NaN take softmax_row): then x - raw max is never inf - inf.
    __mmask16 fused = rows & _mm512_cmp_ps_mask(_mm512_abs_ps(raw_max), vflt_max, _CMP_LE_OQ) &
                      _mm512_cmp_ps_mask(_mm512_abs_ps(scaled_max), vflt_max, _CMP_LE_OQ);
    // 0 in the block holding the running max; else the gap to it, <= 0 (-inf when it overflows).
    // From the rounded scaled max: raw max * scale - m_new contracted into an FMA would leave the
    // product's rounding error as y (this file is compiled with -ffp-contract=off for that).
    const __m512 offset = _mm512_mul_ps(_mm512_sub_ps(scaled_max, m_new), _mm512_set1_ps(kLog2e));
    // Where raw max scale log2(e) and the offset are both within 64, y = x scale log2(e) + bias in
    // one FMA, bias = offset - raw max scale log2(e): its rounding moves y by at most 2^-18, P by 4e-6
    // relative (the exp's own error is 7.5e-5), and P at the block's max is then 1 within that.
    const __m512 raw_log2 = _mm512_mul_ps(raw_max, vscale_log2e), v64 = _mm512_set1_ps(64.0f);
    const __mmask16 direct =
        _mm512_cmp_ps_mask(_mm512_abs_ps(raw_log2), v64, _CMP_LE_OQ) & _mm512_cmp_ps_mask(_mm512_abs_ps(offset), v64, _CMP_LE_OQ);
    alignas(64) float neg_raw_max_of[16], offset_of[16], bias_of[16];
    _mm512_store_ps(neg_raw_max_of, _mm512_sub_ps(_mm512_setzero_ps(), raw_max));
    _mm512_store_ps(offset_of, offset);
    _mm512_store_ps(bias_of, _mm512_sub_ps(offset, raw_log2));
    __m512 sums[16];
    for (int i = 0; i < 16; ++i) {
      sums[i] = _mm512_setzero_ps();
      if (i >= n) continue;
      const int r = r0 + i;
      if (!((fused >> i) & 1)) {
        softmax_row<true>(t, r);  // reads and writes its own m, l and alpha
        if (kBf16Out) store_row_bf16(t, r);
        continue;
      }
      float* s = t.s + r * kBlockKeys;
      __m512 p[kVectors];
      if ((direct >> i) & 1) {
        const __m512 vbias = _mm512_set1_ps(bias_of[i]);
#pragma GCC unroll 8
        for (int k = 0; k < kVectors; ++k) p[k] = _mm512_fmadd_ps(_mm512_loadu_ps(s + 16 * k), vscale_log2e, vbias);
      } else {
        const __m512 vneg_raw_max = _mm512_set1_ps(neg_raw_max_of[i]), voffset = _mm512_set1_ps(offset_of[i]);
#pragma GCC unroll 8
        for (int k = 0; k < kVectors; ++k) {
          const __m512 gap = _mm512_fmadd_ps(_mm512_loadu_ps(s + 16 * k), one, vneg_raw_max);  // x - raw max, on an FMA pipe
          p[k] = _mm512_fmadd_ps(gap, vscale_log2e, voffset);
        }
      }
#pragma GCC unroll 8
      for (int k = 0; k < kVectors; ++k) {  // p[k] holds y until here
        if constexpr (kBf16Out) {
          p[k] = exp2_for_bf16_unclamped(p[k]);
        } else {
          p[k] = exp2_for_bf16(p[k]);
          _mm512_storeu_ps(s + 16 * k, p[k]);
        }
      }
      if (kBf16Out)
#pragma GCC unroll 4
        for (int k = 0; k < kVectors; k += 2)
          _mm512_storeu_si512(t.p_bf16 + r * kBlockKeys + 16 * k, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p[k + 1], p[k])));
      for (int w = kVectors / 2; w > 0; w /= 2)
#pragma GCC unroll 4
        for (int k = 0; k < w; ++k) p[k] = _mm512_add_ps(p[k], p[k + w]);
      sums[i] = p[0];
    }
    const __m512 sum = reduce_rows(sums, add);
    if constexpr (kBf16Out) {
      __mmask16 redo = fused & _mm512_cmp_ps_mask(sum, sum, _CMP_UNORD_Q);
      fused &= static_cast<__mmask16>(~redo);
      for (; redo; redo &= static_cast<__mmask16>(redo - 1)) {
        const int r = r0 + __builtin_ctz(redo);
        softmax_row<true>(t, r);
        store_row_bf16(t, r);
      }
    }
    // alpha = exp(m_old - m_new), 0 on a row's first block; l = l alpha + the block's sum.
    const __m512 alpha = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m_old, vneg_inf, _CMP_EQ_OQ), exp_nonpositive(_mm512_sub_ps(m_old, m_new)),
                                              _mm512_setzero_ps());
    const __m512 l = _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(fused, t.l + r0), alpha), sum);
    _mm512_mask_storeu_ps(t.alpha + r0, fused, alpha);
    _mm512_mask_storeu_ps(t.m + r0, fused, m_new);
    _mm512_mask_storeu_ps(t.l + r0, fused, l);
  }
}

}  // namespace

void softmax_tile_avx512_bf16p(const SoftmaxTile& t) {
  if (t.cols == kBlockKeys && !t.row_cols && !t.mask && !t.bias && t.scale > 0.0f) {
    if (t.p_bf16) softmax_full_block<true>(t);
    else softmax_full_block<false>(t);
    return;
  }
  for (int r = 0; r < t.rows; ++r) {
    softmax_row<true>(t, r);
    if (t.p_bf16) store_row_bf16(t, r);
  }
}

}  // namespace cubevec::ops::attn
