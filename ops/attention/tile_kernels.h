// The three inner steps of flash attention on one tile (a micro-panel of MR query rows against a
// block of kBlockKeys keys), per ISA:
//   qk:       S = Q_panel K_block^T  (the GEMM micro-kernel, depth = head dim)
//   softmax:  scale, mask or additive bias, online-softmax update of the rows' running max and sum; S becomes P
//   pv:       O = alpha * O + P V_block, one column panel of O at a time
// Files per ISA are compiled with that ISA's flags and include no C++ library headers (see
// ops/gemm/microkernel.h for why).
#pragma once

#include <cstdint>

#include "ops/gemm/microkernel.h"

namespace cubevec::ops::attn {

// Keys per tile: the row stride of the S/P tile, a compile-time constant so the PV kernel reaches
// each row of P by a fixed displacement from one base register.
inline constexpr int kBlockKeys = 128;

struct SoftmaxTile {
  float* s = nullptr;                 // rows x kBlockKeys: scores in, probabilities out
  int rows = 0;                       // rows in the tile (MR)
  int cols = 0;                       // valid keys in the block
  const int32_t* row_cols = nullptr;  // per row, the keys it may see (a causal prefix), or null: cols
  const uint8_t* mask = nullptr;      // row r at mask + r * mask_ld (bool bytes, 1 = attend), or null
  int64_t mask_ld = 0;
  int mask_rows = 0;            // rows that have a mask row (the rest attend to every key)
  const float* bias = nullptr;  // row r at bias + r * bias_ld, added after scaling (r < bias_rows), or null
  int64_t bias_ld = 0;
  int bias_rows = 0;
  float scale = 1.0f;
  float* m = nullptr;      // per row: running max of the scaled scores (-inf at first)
  float* l = nullptr;      // per row: running sum of exp(score - m)
  float* alpha = nullptr;  // per row, out: exp(m_old - m_new), the factor for O
  // softmax_tile_avx512_bf16p only: when set, P goes here instead, in bf16 (nearest even; row
  // stride kBlockKeys; the columns from cols up to the next multiple of 32 zero), and s is scratch.
  uint16_t* p_bf16 = nullptr;
};

// O[MR x W] (row stride ldo) = (alpha ? alpha[r] * O : 0) + P[MR x kc] (row stride kBlockKeys) x
// V[kc x W] (packed k-major, W wide).
using PvKernel = void (*)(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha);
using SoftmaxKernel = void (*)(const SoftmaxTile& tile);

struct TileKernels {
  int mr = 0;  // query rows per micro-panel
  int nr = 0;  // keys per QK micro-kernel call
  gemm::MicroKernel qk = nullptr;
  int pv_wide = 0, pv_narrow = 0;  // column widths of the two PV kernels
  PvKernel pv_wide_kernel = nullptr, pv_narrow_kernel = nullptr;
  SoftmaxKernel softmax = nullptr;
};

// AVX-512: MR 14, QK 32 keys per call, PV 32 and 16 columns.
void pv_avx512_w32(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha);
void pv_avx512_w16(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha);
void softmax_tile_avx512(const SoftmaxTile& tile);
// The same step with an exp accurate to bf16's precision (7.5e-5 relative), for tiles whose P is
// rounded to bf16 before P V (flash_bf16, flash_int8), which it writes as bf16 into tile.p_bf16
// (f32 into s when that is null). Needs AVX512-BF16 (tile_kernels_avx512_bf16p.cpp).
void softmax_tile_avx512_bf16p(const SoftmaxTile& tile);

// AVX2 (MR 6, intrinsics) and portable (MR 4, plain loops the compiler vectorizes): PV 16 and 8 columns.
void pv_avx2_w16(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha);
void pv_avx2_w8(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha);
void softmax_tile_avx2(const SoftmaxTile& tile);
void pv_portable_w16(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha);
void pv_portable_w8(int64_t kc, const float* p, const float* v, float* o, int64_t ldo, const float* alpha);
void softmax_tile_portable(const SoftmaxTile& tile);

}  // namespace cubevec::ops::attn
