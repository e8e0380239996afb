// flash_bf16's two matmul steps with AVX512-BF16 dot products (vdpbf16ps), for CPUs that have
// them without AMX (AMD Zen 4 and 5 at full rate): the contracts of amx_qk_block / amx_pv_block
// (flash_amx_kernels.h), the same packed K and V. Compiled with -mavx512f -mavx512bw -mavx512bf16
// (see ops/CMakeLists.txt); called only where the CPU has AVX512-BF16.
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics pass an uninitialized vector as the unused merge source, which
// -Wmaybe-uninitialized reports at every inlined use: a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "ops/attention/flash_amx_kernels.h"
#include "ops/attention/p_to_bf16.h"
#include "ops/attention/tile_kernels.h"

namespace cubevec::ops::attn {

namespace {

constexpr int kRows = 8;  // rows per register block: 8 x 2 accumulators of 16 floats

// 32 bf16 (16 pairs) from a 32-bit pair broadcast, as the dot product's operand type.
__m512bh pair_broadcast(const uint16_t* pair) { return reinterpret_cast<__m512bh>(_mm512_set1_epi32(*reinterpret_cast<const int*>(pair))); }
__m512bh load_pairs(const uint16_t* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); }

}  // namespace

void dot_qk_block(const uint16_t* q, int64_t dpad, const uint16_t* k_packed, float* s) {
  for (int r0 = 0; r0 < kAmxRows; r0 += kRows)
    for (int j0 = 0; j0 < kBlockKeys; j0 += 32) {
      __m512 acc[kRows][2];
      for (auto& row : acc) row[0] = row[1] = _mm512_setzero_ps();
      for (int64_t pair = 0; pair < dpad / 2; ++pair) {
        const uint16_t* kp = k_packed + (pair * kBlockKeys + j0) * 2;
        const __m512bh b0 = load_pairs(kp), b1 = load_pairs(kp + 32);
        for (int i = 0; i < kRows; ++i) {
          const __m512bh a = pair_broadcast(q + (r0 + i) * dpad + 2 * pair);
          acc[i][0] = _mm512_dpbf16_ps(acc[i][0], a, b0);
          acc[i][1] = _mm512_dpbf16_ps(acc[i][1], a, b1);
        }
      }
      for (int i = 0; i < kRows; ++i) {
        _mm512_storeu_ps(s + (r0 + i) * kBlockKeys + j0, acc[i][0]);
        _mm512_storeu_ps(s + (r0 + i) * kBlockKeys + j0 + 16, acc[i][1]);
      }
    }
}

void dot_pv_block(const float* p, int keys, int64_t dpad, const uint16_t* v_packed, float* o, const float* alpha) {
  // P in bf16 (nearest even), the columns past `keys` zero, as the AMX kernel rounds it.
  alignas(64) uint16_t pb[kAmxRows * kBlockKeys];
  const int chunks = round_p_to_bf16(p, keys, pb);
  const int pairs = chunks * 16;
  for (int r0 = 0; r0 < kAmxRows; r0 += kRows)
    for (int64_t c0 = 0; c0 < dpad; c0 += 32) {
      __m512 acc[kRows][2];
      for (auto& row : acc) row[0] = row[1] = _mm512_setzero_ps();
      for (int kp = 0; kp < pairs; ++kp) {
        const uint16_t* vp = v_packed + (kp * dpad + c0) * 2;
        const __m512bh b0 = load_pairs(vp), b1 = load_pairs(vp + 32);
        for (int i = 0; i < kRows; ++i) {
          const __m512bh a = pair_broadcast(pb + (r0 + i) * kBlockKeys + 2 * kp);
          acc[i][0] = _mm512_dpbf16_ps(acc[i][0], a, b0);
          acc[i][1] = _mm512_dpbf16_ps(acc[i][1], a, b1);
        }
      }
      for (int i = 0; i < kRows; ++i) {
        float* row = o + (r0 + i) * dpad + c0;
        for (int h = 0; h < 2; ++h) {
          __m512 v = acc[i][h];
          if (alpha) v = _mm512_fmadd_ps(_mm512_set1_ps(alpha[r0 + i]), _mm512_loadu_ps(row + 16 * h), v);
          _mm512_storeu_ps(row + 16 * h, v);
        }
      }
    }
}

}  // namespace cubevec::ops::attn
