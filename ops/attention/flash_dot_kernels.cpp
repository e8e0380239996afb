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
#include "ops/attention/tile_kernels.h"

namespace cubevec::ops::attn {

namespace {

constexpr int kRows = 8;  // rows per register block: 8 x 2 accumulators of 16 floats

// 32 bf16 (16 pairs) from a 32-bit pair broadcast, as the dot product's operand type.
__m512bh pair_broadcast(const uint16_t* pair) { return reinterpret_cast<__m512bh>(_mm512_set1_epi32(*reinterpret_cast<const int*>(pair))); }
__m512bh load_pairs(const uint16_t* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); }

}  // namespace

void dot_qk_block(const uint16_t* q, int64_t dpad, const uint16_t* k_packed, float* s) {
  for (int j0 = 0; j0 < kBlockKeys; j0 += 32)
    for (int r0 = 0; r0 < kAmxRows; r0 += kRows) {
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

void dot_pv_block(const uint16_t* pb, int keys, int64_t dpad, const uint16_t* v_packed, float* o, const float* alpha) {
  const int pairs = (keys + 31) / 32 * 16;  // the pairs of keys in 32-key steps that hold any key, as the AMX kernel's
  for (int64_t c0 = 0; c0 < dpad; c0 += 32)
    for (int r0 = 0; r0 < kAmxRows; r0 += kRows) {
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

void pack_k_block_bf16_avx512(const uint16_t* rows, int64_t ld, int keys, int64_t d, int64_t dpad, uint16_t* k) {
  // As 32-bit pairs the layout is a transpose: pair p of key j at k32[p * 128 + j]. Sixteen keys'
  // pair at a time by one gather (the rows' byte offsets fit in 32 bits: see the declaration).
  uint32_t* k32 = reinterpret_cast<uint32_t*>(k);
  const __m512i row_bytes = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32(static_cast<int>(ld * 2)));
  for (int j0 = 0; j0 < kBlockKeys; j0 += 16) {
    const int valid = keys - j0;
    const __mmask16 present = valid >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>(valid > 0 ? (1u << valid) - 1u : 0u);
    const uint16_t* base = rows + j0 * ld;
    for (int64_t p = 0; p < dpad / 2; ++p) {
      __m512i pairs = _mm512_setzero_si512();
      if (2 * p + 1 < d) {
        pairs = _mm512_mask_i32gather_epi32(pairs, present, row_bytes, base + 2 * p, 1);
      } else if (2 * p < d) {  // an odd d's last element alone: its pair would read past the row
        alignas(64) uint32_t last[16] = {};
        for (int i = 0; i < 16 && i < valid; ++i) last[i] = base[i * ld + 2 * p];
        pairs = _mm512_load_si512(last);
      }
      _mm512_storeu_si512(k32 + p * kBlockKeys + j0, pairs);
    }
  }
}

void pack_v_block_bf16_avx512(const uint16_t* rows, int64_t ld, int keys, int64_t d, int64_t dpad, uint16_t* v) {
  // Keys j and j + 1 interleaved element by element: 32 columns of each row make two vectors.
  __m512i low = _mm512_setzero_si512(), high = _mm512_setzero_si512();
  {
    alignas(64) uint16_t lo[32], hi[32];
    for (int i = 0; i < 16; ++i) lo[2 * i] = static_cast<uint16_t>(i), lo[2 * i + 1] = static_cast<uint16_t>(32 + i);
    for (int i = 0; i < 32; ++i) hi[i] = static_cast<uint16_t>(lo[i] + 16);
    low = _mm512_load_si512(lo), high = _mm512_load_si512(hi);
  }
  for (int j = 0; j < kBlockKeys; j += 2) {
    uint16_t* pair = v + (j / 2) * dpad * 2;
    for (int64_t c = 0; c < dpad; c += 32) {
      const int64_t left = d - c;
      const __mmask32 in_row = left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>(left > 0 ? (1u << left) - 1u : 0u);
      const __m512i a = j < keys ? _mm512_maskz_loadu_epi16(in_row, rows + j * ld + c) : _mm512_setzero_si512();
      const __m512i b = j + 1 < keys ? _mm512_maskz_loadu_epi16(in_row, rows + (j + 1) * ld + c) : _mm512_setzero_si512();
      _mm512_storeu_si512(pair + 2 * c, _mm512_permutex2var_epi16(a, low, b));
      _mm512_storeu_si512(pair + 2 * c + 32, _mm512_permutex2var_epi16(a, high, b));
    }
  }
}

}  // namespace cubevec::ops::attn
