// What the int8 GEMM's per-ISA files see: plain data and function declarations only (no standard
// library headers), so nothing compiled for a wider ISA can be the copy the linker keeps for all
// (see ops/gemm/microkernel.h). The driver and its API are in ops/gemm/int8.h.
#pragma once

#include <cstdint>

#include "ops/gemm/epilogue.h"

namespace cubevec::ops::gemm {

struct Int8Epilogue {
  const int32_t* int_bias = nullptr;  // [N] added to the s32 sum (static W8A8's quant_bias), or null
  const float* row_scale = nullptr;   // [M] (per-token activation scale), or null (1)
  const float* col_scale = nullptr;   // [N] (per-channel weight / dequant scale), or null (1)
  const float* bias = nullptr;        // [N] float bias added after scaling, or null
  Epilogue rest;                      // activation, residual, gate, bf16 store: as the float GEMM's
};

// Where an int32 tile goes: C [M, N] f32 (an f32 scratch when rest.out_bf16 is set), with the
// weight's column sums that undo the +128 shift of A.
struct Int8Output {
  float* c = nullptr;
  int64_t ldc = 0;
  const int32_t* column_sums = nullptr;  // [N]
  Int8Epilogue epilogue;
};

// C[MR x NR] (s32, row stride ldc) = A panel [k_quads][MR][4] (u8) x B panel [k_quads][NR][4] (s8).
inline constexpr int kMrInt8Avx512 = 14, kNrInt8Avx512 = 32;
void int8_microkernel_avx512_vnni(int64_t k_quads, const uint8_t* a, const int8_t* b, int32_t* c, int64_t ldc);
inline constexpr int kMrInt8AvxVnni = 6, kNrInt8AvxVnni = 16;
void int8_microkernel_avx_vnni(int64_t k_quads, const uint8_t* a, const int8_t* b, int32_t* c, int64_t ldc);
// AMX-INT8: C[32 x 32] from four 16 x 16 s32 tile accumulators. A is packed in k blocks of 64:
// [k_quads / 16][MR][64] (u8; each block two A tiles of 16 rows); B is the AVX512-VNNI panel
// [k_quads][32][4] read as two B tiles of 16 columns (128-byte rows). k_quads must be a multiple of
// 16 (the packing pads K to 64 with zeros). Called only where amx_ready() granted the tile state.
inline constexpr int kMrInt8Amx = 32, kNrInt8Amx = 32, kKQuadsPerAmxBlock = 16;
void int8_microkernel_amx(int64_t k_quads, const uint8_t* a, const int8_t* b, int32_t* c, int64_t ldc);
namespace amx_model {  // the same on the tile model (ops/gemm/amx_model.h; int8_microkernel_amx_model.cpp)
void int8_microkernel_amx(int64_t k_quads, const uint8_t* a, const int8_t* b, int32_t* c, int64_t ldc);
}
// AVX2 without VNNI: A is packed as u16 quads, [k_quads][MR][4] (see int8_microkernel_avx2.cpp).
inline constexpr int kMrInt8Avx2 = 6, kNrInt8Avx2 = 8;
void int8_microkernel_avx2(int64_t k_quads, const uint8_t* a, const int8_t* b, int32_t* c, int64_t ldc);
inline constexpr int kMrInt8Portable = 4, kNrInt8Portable = 16;
void int8_microkernel_portable(int64_t k_quads, const uint8_t* a, const int8_t* b, int32_t* c, int64_t ldc);

// The epilogue of an int32 tile: rows x cols of `acc` (row stride ld_acc), at (i0, j0) of C.
void int8_epilogue_avx512(const Int8Output& out, const int32_t* acc, int64_t ld_acc, int64_t i0, int64_t j0, int64_t rows, int64_t cols);
void int8_epilogue_avx2(const Int8Output& out, const int32_t* acc, int64_t ld_acc, int64_t i0, int64_t j0, int64_t rows, int64_t cols);
void int8_epilogue_portable(const Int8Output& out, const int32_t* acc, int64_t ld_acc, int64_t i0, int64_t j0, int64_t rows, int64_t cols);

}  // namespace cubevec::ops::gemm
