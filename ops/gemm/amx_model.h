// A model of the AMX tile instructions in plain C++: eight tile registers per thread, the palette-1
// configuration, loads, stores, zeroing and the three dot products cubevec uses (TDPBF16PS,
// TDPBUSD, TDPBSSD), with the checks the CPU makes (#UD there, an Error here). cubevec's AMX kernels
// are compiled a second time against it (ops/gemm/amx_tiles.h under CUBEVEC_AMX_MODEL_BUILD, the
// *_model.cpp files) so that the same kernel code runs, hundreds of times slower, on CPUs without
// AMX: what lets its tests (and CUBEVEC_AMX_MODEL=1 runs) check the AMX paths anywhere.
// Plain declarations only: the kernels that call these are compiled for AVX-512 (see
// ops/gemm/microkernel.h for why).
#pragma once

#include <cstdint>

namespace cubevec::ops::gemm::amx_model {

// LDTILECFG from the 64-byte configuration (palette 1: up to 16 rows of up to 64 bytes a tile;
// palette 0 releases the tiles).
void load_config(const void* config);
// TILEZERO, TILELOADD, TILESTORED: `rows` rows of `colsb` bytes, rows `stride` bytes apart.
void zero(int tile);
void load(int tile, const void* base, int64_t stride);
void store(int tile, void* base, int64_t stride);
// dst (+)= a x b: f32 sums of bf16 pairs; s32 sums of u8 x s8 / s8 x s8 quads (wrapping as the
// hardware does).
void dp_bf16ps(int dst, int a, int b);
void dp_busd(int dst, int a, int b);
void dp_bssd(int dst, int a, int b);

}  // namespace cubevec::ops::gemm::amx_model
