// flash_bf16's two matmul steps with AVX512-BF16 dot products (vdpbf16ps), for CPUs that have
// them without AMX (AMD Zen 4 and 5 at full rate): the contracts of amx_qk_block / amx_pv_block
// (flash_amx_kernels.h), the same packed K and V; and flash_int8's Q K^T with AVX512-VNNI
// (vpdpbusd) on amx_qk_block_int8's packed K. Compiled with -mavx512f -mavx512bw -mavx512bf16
// -mavx512vnni (see ops/CMakeLists.txt); each called only where the CPU has its instructions.
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics pass an uninitialized vector as the unused merge source, which
// -Wmaybe-uninitialized (or, inlined into a loop, -Wuninitialized) reports at every use: a false
// positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
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

void dot_qk_block_int8(const uint8_t* q_shifted, int64_t dpad8, const int8_t* k_packed, const int32_t* k_sums, const float* row_scale,
                       float k_scale, float* s) {
  const __m512 col = _mm512_set1_ps(k_scale);
  for (int r0 = 0; r0 < kAmxRows; r0 += kRows)
    for (int j0 = 0; j0 < kBlockKeys; j0 += 32) {
      __m512i acc[kRows][2];
      for (auto& row : acc) row[0] = row[1] = _mm512_setzero_si512();
      for (int64_t quad = 0; quad < dpad8 / 4; ++quad) {
        const int8_t* kp = k_packed + (quad * kBlockKeys + j0) * 4;  // 16 keys x 4 dimensions per vector
        const __m512i b0 = _mm512_loadu_si512(kp), b1 = _mm512_loadu_si512(kp + 64);
        for (int i = 0; i < kRows; ++i) {
          int32_t four;
          __builtin_memcpy(&four, q_shifted + (r0 + i) * dpad8 + 4 * quad, 4);
          const __m512i a = _mm512_set1_epi32(four);
          acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], a, b0);
          acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], a, b1);
        }
      }
      // (q + 128) . k - 128 sum(k) = q . k, exactly; then the scales as amx_qk_block_int8 applies them.
      const __m512i shift0 = _mm512_slli_epi32(_mm512_loadu_si512(k_sums + j0), 7);
      const __m512i shift1 = _mm512_slli_epi32(_mm512_loadu_si512(k_sums + j0 + 16), 7);
      for (int i = 0; i < kRows; ++i) {
        const __m512 row = _mm512_set1_ps(row_scale[r0 + i]);
        float* out = s + (r0 + i) * kBlockKeys + j0;
        _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][0], shift0)), row), col));
        _mm512_storeu_ps(out + 16, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][1], shift1)), row), col));
      }
    }
}

}  // namespace cubevec::ops::attn
