// Compiled with -mamx-tile -mamx-bf16 -mamx-int8 -mavx512f -mavx512bw -mavx512bf16 (see
// ops/CMakeLists.txt); called only where ops::gemm::amx_ready() granted the tile state (and, for
// the int8 product, where the CPU has AMX-INT8). Tiles as every cubevec AMX
// kernel: 0-3 f32 accumulators, 4-5 A (16 rows x 32 bf16), 6-7 B (16 pairs x 16 columns x 2).
#include "ops/attention/flash_amx_kernels.h"

#include <immintrin.h>

#include "ops/attention/tile_kernels.h"
#include "ops/gemm/amx_tiles.h"

// GCC 12's AVX-512 intrinsics pass an uninitialized vector (_mm512_undefined_*) as the unused merge
// source, which -Wmaybe-uninitialized (and, for the int32 conversion, -Wuninitialized) reports at
// every inlined use: a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace cubevec::ops::attn {
CUBEVEC_AMX_KERNELS_BEGIN

void amx_qk_block(const uint16_t* q, int64_t dpad, const uint16_t* k_packed, float* s) {
  gemm::configure_amx_tiles();
  const int64_t q_stride = dpad * 2, k_stride = kBlockKeys * 4, s_stride = kBlockKeys * 4;  // bytes
  for (int j = 0; j < kBlockKeys; j += 32) {                                                // keys j .. j + 31: two B tiles of 16
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c = 0; c < dpad; c += 32) {  // 32 dimensions = 16 pairs per step
      const uint16_t* kb = k_packed + (c / 2) * kBlockKeys * 2 + j * 2;
      _tile_loadd(4, q + c, q_stride);
      _tile_loadd(6, kb, k_stride);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, kb + 32, k_stride);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, q + 16 * dpad + c, q_stride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, s + j, s_stride);
    _tile_stored(1, s + j + 16, s_stride);
    _tile_stored(2, s + 16 * kBlockKeys + j, s_stride);
    _tile_stored(3, s + 16 * kBlockKeys + j + 16, s_stride);
  }
}

void amx_pv_block(const uint16_t* pb, int keys, int64_t dpad, const uint16_t* v_packed, float* o, const float* alpha) {
  gemm::configure_amx_tiles();
  const int chunks = (keys + 31) / 32;                           // 32-key steps that hold any key
  const int64_t v_stride = dpad * 4, p_stride = kBlockKeys * 2;  // bytes
  alignas(64) float tile[kAmxRows * 32];
  for (int64_t g = 0; g < dpad; g += 32) {  // columns g .. g + 31: two B tiles of 16
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int c = 0; c < chunks * 32; c += 32) {  // 32 keys = 16 pairs per step
      const uint16_t* vb = v_packed + (c / 2) * dpad * 2 + g * 2;
      _tile_loadd(4, pb + c, p_stride);
      _tile_loadd(6, vb, v_stride);
      _tile_dpbf16ps(0, 4, 6);
      _tile_loadd(7, vb + 32, v_stride);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, pb + 16 * kBlockKeys + c, p_stride);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, tile, 128);
    _tile_stored(1, tile + 16, 128);
    _tile_stored(2, tile + 16 * 32, 128);
    _tile_stored(3, tile + 16 * 32 + 16, 128);
    for (int r = 0; r < kAmxRows; ++r) {
      float* row = o + r * dpad + g;
      for (int h = 0; h < 32; h += 16) {
        __m512 v = _mm512_load_ps(tile + r * 32 + h);
        if (alpha) v = _mm512_fmadd_ps(_mm512_set1_ps(alpha[r]), _mm512_loadu_ps(row + h), v);
        _mm512_storeu_ps(row + h, v);
      }
    }
  }
}

void amx_qk_block_int8(const int8_t* q, int64_t dpad8, const int8_t* k_packed, const float* row_scale, float k_scale, float* s) {
  gemm::configure_amx_tiles();
  int32_t* const si = reinterpret_cast<int32_t*>(s);                   // the int32 sums land in S, then become f32 in place
  const int64_t k_stride = kBlockKeys * 4, s_stride = kBlockKeys * 4;  // bytes
  for (int j = 0; j < kBlockKeys; j += 32) {                           // keys j .. j + 31: two B tiles of 16
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t c = 0; c < dpad8; c += 64) {  // 64 dimensions = 16 quads per step
      const int8_t* kb = k_packed + (c / 4) * kBlockKeys * 4 + j * 4;
      _tile_loadd(4, q + c, dpad8);
      _tile_loadd(6, kb, k_stride);
      _tile_dpbssd(0, 4, 6);
      _tile_loadd(7, kb + 64, k_stride);
      _tile_dpbssd(1, 4, 7);
      _tile_loadd(5, q + 16 * dpad8 + c, dpad8);
      _tile_dpbssd(2, 5, 6);
      _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, si + j, s_stride);
    _tile_stored(1, si + j + 16, s_stride);
    _tile_stored(2, si + 16 * kBlockKeys + j, s_stride);
    _tile_stored(3, si + 16 * kBlockKeys + j + 16, s_stride);
  }
  const __m512 col = _mm512_set1_ps(k_scale);
  for (int r = 0; r < kAmxRows; ++r) {
    const __m512 row = _mm512_set1_ps(row_scale[r]);
    for (int j = 0; j < kBlockKeys; j += 16) {
      const __m512i sum = _mm512_loadu_si512(si + r * kBlockKeys + j);
      _mm512_storeu_ps(s + r * kBlockKeys + j, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), row), col));
    }
  }
}

CUBEVEC_AMX_KERNELS_END

#ifndef CUBEVEC_AMX_MODEL_BUILD  // no tiles: the model build has no copy of these
float abs_max_avx512(const float* x, int64_t n) {
  __m512 m = _mm512_setzero_ps();
  __mmask16 odd = 0;  // lanes that met a NaN or an infinity
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 valid = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1u);
    const __m512 v = _mm512_maskz_loadu_ps(valid, x + i);
    odd |= _mm512_fpclass_ps_mask(v, 0x99);  // QNaN | +inf | -inf | SNaN
    m = _mm512_max_ps(m, _mm512_abs_ps(v));
  }
  return odd ? __builtin_inff() : _mm512_reduce_max_ps(m);
}

void quantize_int8_avx512(const float* x, int64_t n, float inv, int8_t* dst) {
  const __m512 scale = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 valid = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1u);
    const __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(valid, x + i), scale), lo), hi);
    _mm512_mask_cvtsepi32_storeu_epi8(dst + i, valid, _mm512_cvtps_epi32(v));  // rounds to nearest even
  }
}
#endif

}  // namespace cubevec::ops::attn
