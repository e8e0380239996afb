// The unit of work every attention implementation takes: a list of independent heads, each a
// (q, k, v, out) quadruple of row-major matrices with their own lengths, row strides and mask.
// attention_forward and attention_forward_varlen only translate their layouts into this.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/dtype.h"

namespace cubevec::ops::attn {

struct HeadProblem {
  const void* q = nullptr;  // sq rows of d elements, row stride q_ld (elements)
  const void* k = nullptr;  // sk rows
  const void* v = nullptr;  // sk rows
  void* out = nullptr;      // sq rows
  int64_t q_ld = 0, k_ld = 0, v_ld = 0, out_ld = 0;
  int64_t sq = 0, sk = 0;
  const uint8_t* mask = nullptr;  // [sq, sk] bool bytes with row stride mask_ld, 1 = attend; or null
  int64_t mask_ld = 0;
  const float* bias = nullptr;  // [sq, sk] f32 added to the scaled scores, row stride bias_ld; or null
  int64_t bias_ld = 0;
  bool causal = false;  // key j visible to query i when j <= i + (sk - sq)
  // Block sparsity (sparse attention): query block qb (rows [128 qb, 128 qb + 128)) attends to key
  // block kb (keys [128 kb, 128 kb + 128)) when block_keep[qb * block_ld + kb] != 0; null = dense.
  // The rows of a query block that keeps no key block come out zero (MindIE's ada kernel for a
  // count of 0), not NaN.
  const uint8_t* block_keep = nullptr;
  int64_t block_ld = 0;
  // Optional out (flash and cv_pipelined only): per query row, the log-sum-exp of its scaled scores
  // over the keys it attended to (natural log), -inf for a row that attended to none. Ring
  // attention merges partial results with it.
  float* lse = nullptr;
};

inline constexpr int64_t kSparseBlock = 128;  // MindIE SD's block size: query and key blocks

struct AttentionBatch {
  std::vector<HeadProblem> heads;
  int64_t d = 0;             // head dim, the same for q, k, v and out
  DType dtype = DType::f32;  // of q, k, v and out: f32 or bf16
  float scale = 1.0f;

  double flops() const;  // 4 * sq * sk * d summed over heads
};

struct TileKernels;

// Every implementation; each runs inside a Cube-unit kernel body (tbb::parallel_for uses the
// unit's threads). A row that can attend to no key comes out NaN.
void run_math(const AttentionBatch& batch);
// `kernels`: the tile kernels of one ISA (tests run each); null for the widest this CPU has.
void run_flash(const AttentionBatch& batch, const TileKernels* kernels = nullptr);
// Flash attention with bf16 products (flash_amx.cpp): AMX-BF16 tiles, or where the CPU has no AMX,
// AVX512-BF16 dot products on the same operands; throws where neither is available.
enum class Bf16Tiles { amx, avx512_bf16 };
bool bf16_tiles_available(Bf16Tiles tiles);
bool flash_amx_available();                       // either of them
void run_flash_amx(const AttentionBatch& batch);  // AMX where available, else AVX512-BF16
void run_flash_amx(const AttentionBatch& batch, Bf16Tiles tiles);
// The same with Q K^T in int8 (SageAttention's smoothing and block scales): on AMX-INT8 tiles (P V
// on AMX-BF16), or where the CPU has no AMX, AVX512-VNNI dot products (P V on AVX512-BF16); throws
// where neither is available.
enum class Int8Tiles { amx, avx512_vnni };
bool int8_tiles_available(Int8Tiles tiles);
bool flash_int8_available();                       // either of them
void run_flash_int8(const AttentionBatch& batch);  // AMX where available, else AVX512-VNNI
void run_flash_int8(const AttentionBatch& batch, Int8Tiles tiles);
// The int32 sums of int8 products hold head dims up to this (127^2 x 65536 < 2^31).
inline constexpr int64_t kFlashInt8MaxHeadDim = 65536;

}  // namespace cubevec::ops::attn
