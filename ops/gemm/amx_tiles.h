// The AMX tile configuration every cubevec AMX kernel uses (palette 1, all eight tiles 16 rows of
// 64 bytes: 0-3 accumulators, 4-5 A, 6-7 B), loaded once per thread. Included only by files
// compiled with -mamx-tile; `static` keeps each copy (and its per-thread flag) private to its file.
#pragma once

#include <immintrin.h>

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
  _tile_loadconfig(&config);
  configured = true;
}

}  // namespace cubevec::ops::gemm
