// The AMX-BF16 and AMX-INT8 peak loops, compiled with -mamx-tile -mamx-bf16 -mamx-int8
// (bench/CMakeLists.txt) and called only where ops::gemm::amx_ready() granted the tile state (the
// int8 one only where ops::gemm::int8_isa_supported(Int8Isa::amx)).
#include <immintrin.h>

#include <cstdint>

#include "ops/gemm/amx_tiles.h"

namespace cubevec::bench {

namespace {

// The tile layout cubevec's AMX kernels use (0-3 accumulators, 4-5 A, 6-7 B), the accumulators
// zeroed and the operand tiles loaded once from `operand` (16 rows of 64 bytes).
void load_operand_tiles(const void* operand) {
  ops::gemm::configure_amx_tiles();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
}

}  // namespace

// Four independent tdpbf16ps chains (each 16 x 16 outputs x 32 bf16 products = 16,384 flops)
// fed from tiles loaded once; returns a value so the work is not dropped.
float amx_loop(long iterations) {
  alignas(64) static thread_local uint16_t operand[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) operand[i] = 0x3c00;  // bf16 2^-7
  alignas(64) static thread_local float out[16 * 16];
  load_operand_tiles(operand);
  for (long i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  return out[0];
}

// Four independent tdpbusd chains (each 16 x 16 outputs x 64 u8 x s8 products = 32,768 int ops).
int amx_int8_loop(long iterations) {
  alignas(64) static thread_local uint8_t operand[16 * 64];
  for (int i = 0; i < 16 * 64; ++i) operand[i] = 1;
  alignas(64) static thread_local int32_t out[16 * 16];
  load_operand_tiles(operand);
  for (long i = 0; i < iterations; ++i) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  return out[0];
}

}  // namespace cubevec::bench
