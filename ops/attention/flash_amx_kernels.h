// The two matmul steps of bf16 flash attention on AMX-BF16 tiles (ops/attention/flash_amx.cpp runs
// them around the f32 online softmax of tile_kernels.h). A tile is 32 query rows against one block
// of kBlockKeys (128) keys; head dims are zero-padded to dpad, a multiple of 32. Plain declarations
// only: the file that defines them is compiled for AMX (see ops/gemm/microkernel.h for why).
#pragma once

#include <cstdint>

namespace cubevec::ops::attn {

inline constexpr int kAmxRows = 32;  // query rows per tile: two 16-row A tiles

// S [32 x 128] (row stride 128) = Q [32 x dpad] (bf16, row stride dpad) times the key block's K^T,
// K packed as dpad / 2 pairs of dimensions x 128 keys x 2 (keys past the head's end zero).
void amx_qk_block(const uint16_t* q, int64_t dpad, const uint16_t* k_packed, float* s);

// O [32 x dpad] (f32, row stride dpad) = (alpha ? alpha[r] O : 0) + P V: P [32 x 128] bf16 (row
// stride 128, as softmax_tile_avx512_bf16p writes it: the columns from `keys` up to the next
// multiple of 32 zero, the rest not read); V packed as 64 pairs of keys x dpad x 2 (keys past the
// head's end zero).
void amx_pv_block(const uint16_t* p, int keys, int64_t dpad, const uint16_t* v_packed, float* o, const float* alpha);

// The three tile kernels above on the tile model (ops/gemm/amx_model.h; flash_amx_kernels_model.cpp).
namespace amx_model {
void amx_qk_block(const uint16_t* q, int64_t dpad, const uint16_t* k_packed, float* s);
void amx_pv_block(const uint16_t* p, int keys, int64_t dpad, const uint16_t* v_packed, float* o, const float* alpha);
void amx_qk_block_int8(const int8_t* q, int64_t dpad8, const int8_t* k_packed, const float* row_scale, float k_scale, float* s);
}  // namespace amx_model

// The same two steps with AVX512-BF16 dot products (flash_dot_kernels.cpp, compiled for
// AVX512-BF16; called only where the CPU has it): for CPUs without AMX. Same layouts, same results
// up to the f32 summation order.
void dot_qk_block(const uint16_t* q, int64_t dpad, const uint16_t* k_packed, float* s);
void dot_pv_block(const uint16_t* p, int keys, int64_t dpad, const uint16_t* v_packed, float* o, const float* alpha);

// The int8 Q K^T of flash_int8 (AMX-INT8, compiled with -mamx-int8 and called only where it is
// available): S [32 x 128] f32 (row stride 128) = (sum x row_scale[r]) x k_scale, sum = Q [32 x
// dpad8] int8 (row stride dpad8) times K^T summed exactly in int32 (the two scales applied one after
// the other: their product alone may overflow); K packed as dpad8 / 4 quads of dimensions x 128
// keys x 4 (dpad8 a multiple of 64, keys past the head's end zero).
void amx_qk_block_int8(const int8_t* q, int64_t dpad8, const int8_t* k_packed, const float* row_scale, float k_scale, float* s);

// The same S with AVX512-VNNI dot products (flash_dot_kernels.cpp, compiled for AVX512-VNNI;
// called only where the CPU has it), which multiply u8 by s8: Q comes shifted to u8 (q + 128, row
// stride dpad8) and k_sums holds each of the block's 128 keys' sum of its int8 values, so that
// (q + 128) . k - 128 sum(k) gives the exact int32 sum. Same layouts and the same f32 result.
void dot_qk_block_int8(const uint8_t* q_shifted, int64_t dpad8, const int8_t* k_packed, const int32_t* k_sums, const float* row_scale,
                       float k_scale, float* s);

// Key block packing from bf16 rows (`keys` of them, at most 128, row stride ld elements, d
// elements each; zero past them up to 128 keys and dpad elements), with AVX-512 (compiled with
// flash_dot_kernels.cpp; called only where the tiles run): K as amx_qk_block reads it (dpad / 2
// pairs x 128 keys x 2), for 16 * ld * 2 bytes within 32-bit offsets (ld < 2^26); V as
// amx_pv_block reads it (64 key pairs x dpad x 2).
void pack_k_block_bf16_avx512(const uint16_t* rows, int64_t ld, int keys, int64_t d, int64_t dpad, uint16_t* k);
void pack_v_block_bf16_avx512(const uint16_t* rows, int64_t ld, int keys, int64_t d, int64_t dpad, uint16_t* v);

// max |x[i]| over n floats, or +inf when one of them is not finite (AVX-512).
float abs_max_avx512(const float* x, int64_t n);
// dst[i] = x[i] * inv rounded to the nearest int8 (ties to even), saturated to +-127 (AVX-512).
void quantize_int8_avx512(const float* x, int64_t n, float inv, int8_t* dst);

}  // namespace cubevec::ops::attn
