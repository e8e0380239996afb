// The AVX-512 flash tiles of f32 flash: P V and the accurate softmax step (the one for bf16 P is in
// tile_kernels_avx512_bf16p.cpp). Compiled with -mavx512f -mavx512bw -mavx512vl -mfma
// -ffp-contract=off (see ops/CMakeLists.txt); called only on CPUs with AVX-512.
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

}  // namespace

void pv_avx512_w32(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha) {
  pv_tile<2>(kc, p, v, o, ldo, alpha);
}

void pv_avx512_w16(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha) {
  pv_tile<1>(kc, p, v, o, ldo, alpha);
}

void softmax_tile_avx512(const SoftmaxTile& t) {
  for (int r = 0; r < t.rows; ++r) softmax_row<false>(t, r);
}

}  // namespace cubevec::ops::attn
