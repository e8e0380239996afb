// Compiled with -mamx-tile -mamx-bf16 -mavx512f (see ops/CMakeLists.txt); called only on CPUs with
// AMX-BF16 once the kernel has granted the process the tile state (amx_availability.cpp, amx_ready()).
#include <immintrin.h>

#include "ops/gemm/amx_tiles.h"
#include "ops/gemm/microkernel_bf16.h"

namespace cubevec::ops::gemm {
CUBEVEC_AMX_KERNELS_BEGIN

void microkernel_bf16_amx(int64_t kpairs, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc, bool accumulate) {
  configure_amx_tiles();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  // Per 32-deep k block: A is [32 rows][32 k] (two tiles of 16 rows, 64-byte rows); B is
  // [16 k pairs][32 columns][2] (two tiles of 16 columns, 128-byte rows).
  for (int64_t s = 0; s < kpairs / 16; ++s) {
    const uint16_t* ab = a + s * kMrAmx * 32;
    const uint16_t* bb = b + s * 16 * kNrAmx * 2;
    _tile_loadd(4, ab, 64);
    _tile_loadd(5, ab + 16 * 32, 64);
    _tile_loadd(6, bb, 128);
    _tile_loadd(7, bb + 32, 128);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float tile[kMrAmx][kNrAmx];
  _tile_stored(0, &tile[0][0], kNrAmx * 4);
  _tile_stored(1, &tile[0][16], kNrAmx * 4);
  _tile_stored(2, &tile[16][0], kNrAmx * 4);
  _tile_stored(3, &tile[16][16], kNrAmx * 4);
  for (int r = 0; r < kMrAmx; ++r) {
    float* row = c + r * ldc;
    for (int h = 0; h < kNrAmx; h += 16) {
      __m512 v = _mm512_load_ps(&tile[r][h]);
      if (accumulate) v = _mm512_add_ps(v, _mm512_loadu_ps(row + h));
      _mm512_storeu_ps(row + h, v);
    }
  }
}

CUBEVEC_AMX_KERNELS_END

#ifndef CUBEVEC_AMX_MODEL_BUILD  // no tiles: the model build has no copy of it
void f32_to_bf16_block_amx(const float* src, uint16_t* dst, int n) {
  const __mmask16 lo = static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << (n > 0 ? n : 0)) - 1u);
  const __mmask16 hi = static_cast<__mmask16>(n >= 32 ? 0xFFFF : n > 16 ? (1u << (n - 16)) - 1u : 0u);
  const __m512 a = _mm512_maskz_loadu_ps(lo, src), b = _mm512_maskz_loadu_ps(hi, src + 16);
  const __m512bh v = _mm512_cvtne2ps_pbh(b, a);  // round to nearest even, as f32_to_bf16
  const __mmask32 all = n >= 32 ? 0xFFFFFFFFu : (1u << (n > 0 ? n : 0)) - 1u;
  _mm512_mask_storeu_epi16(dst, all, reinterpret_cast<__m512i>(v));
}
#endif

}  // namespace cubevec::ops::gemm
