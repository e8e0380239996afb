// The AMX tile configuration every cubevec AMX kernel uses (palette 1, all eight tiles 16 rows of
// 64 bytes: 0-3 accumulators, 4-5 A, 6-7 B), loaded once per thread. Included only by files
// compiled with -mamx-tile; `static` keeps each copy (and its per-thread flag) private to its file.
//
// Under CUBEVEC_AMX_MODEL_BUILD (the *_model.cpp files, which compile an AMX kernel file a second time
// without -mamx-*), the tile intrinsics below become calls into amx_model.h's plain C++ tiles and the
// file's kernels land in a nested namespace `amx_model`: the same kernel code, on any AVX-512 CPU.
#pragma once

#include <immintrin.h>

#ifdef CUBEVEC_AMX_MODEL_BUILD
#include "ops/gemm/amx_model.h"
#undef _tile_zero
#undef _tile_loadd
#undef _tile_stored
#undef _tile_dpbf16ps
#undef _tile_dpbusd
#undef _tile_dpbssd
#define _tile_zero(t) ::cubevec::ops::gemm::amx_model::zero(t)
#define _tile_loadd(t, base, stride) ::cubevec::ops::gemm::amx_model::load(t, base, stride)
#define _tile_stored(t, base, stride) ::cubevec::ops::gemm::amx_model::store(t, base, stride)
#define _tile_dpbf16ps(c, a, b) ::cubevec::ops::gemm::amx_model::dp_bf16ps(c, a, b)
#define _tile_dpbusd(c, a, b) ::cubevec::ops::gemm::amx_model::dp_busd(c, a, b)
#define _tile_dpbssd(c, a, b) ::cubevec::ops::gemm::amx_model::dp_bssd(c, a, b)
#define CUBEVEC_AMX_KERNELS_BEGIN namespace amx_model {
#define CUBEVEC_AMX_KERNELS_END }
#else
#define CUBEVEC_AMX_KERNELS_BEGIN
#define CUBEVEC_AMX_KERNELS_END
#endif

namespace cubevec::ops::gemm {

struct alignas(64) AmxTileConfig {
  unsigned char palette_id = 1;
  unsigned char start_row = 0;
  unsigned char reserved[14] = {};
  unsigned short colsb[16] = {};
  unsigned char rows[16] = {};
};

// Tile registers are per thread and start unconfigured; every kernel loads this same shape, so
// one load per thread and file suffices.
static inline void configure_amx_tiles() {
  static thread_local bool configured = false;
  if (configured) return;
  AmxTileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
#ifdef CUBEVEC_AMX_MODEL_BUILD
  amx_model::load_config(&config);
#else
  _tile_loadconfig(&config);
#endif
  configured = true;
}

}  // namespace cubevec::ops::gemm
