// Compiled with -mamx-tile -mamx-int8 -mavx512f (see ops/CMakeLists.txt); called only on CPUs with
// AMX-INT8 once the kernel has granted the process the tile state (amx_availability.cpp, amx_ready()).
// One tdpbusd adds 16 x 16 x 64 u8 x s8 products into a tile of s32 sums.
#include <immintrin.h>

#include "ops/gemm/amx_tiles.h"
#include "ops/gemm/int8_kernels.h"

namespace cubevec::ops::gemm {
CUBEVEC_AMX_KERNELS_BEGIN

void int8_microkernel_amx(int64_t k_quads, const uint8_t* a, const int8_t* b, int32_t* c, int64_t ldc) {
  configure_amx_tiles();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  constexpr int64_t kABlock = kMrInt8Amx * 64, kBBlock = kKQuadsPerAmxBlock * kNrInt8Amx * 4;
  for (int64_t s = 0; s < k_quads / kKQuadsPerAmxBlock; ++s) {
    const uint8_t* ab = a + s * kABlock;
    const int8_t* bb = b + s * kBBlock;
    _tile_loadd(4, ab, 64);
    _tile_loadd(5, ab + 16 * 64, 64);
    _tile_loadd(6, bb, kNrInt8Amx * 4);
    _tile_loadd(7, bb + 64, kNrInt8Amx * 4);
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  const int64_t stride = ldc * static_cast<int64_t>(sizeof(int32_t));
  _tile_stored(0, c, stride);
  _tile_stored(1, c + 16, stride);
  _tile_stored(2, c + 16 * ldc, stride);
  _tile_stored(3, c + 16 * ldc + 16, stride);
}

CUBEVEC_AMX_KERNELS_END
}  // namespace cubevec::ops::gemm
