// The int8 GEMM behind the quantized Linears: C[M, N] = A[M, K] (u8) x W[N, K]^T (s8) summed in
// s32, then a float epilogue. A holds signed int8 activations shifted by +128 (so that VNNI's
// u8 x s8 dot product applies); the shift is taken back per column with the weight's column sums:
//   acc[m][n] = sum_k (a[m][k] + 128) w[n][k] - 128 colsum[n] = sum_k a[m][k] w[n][k].
// Then, fused, y = (acc + int_bias[n]) * row_scale[m] * col_scale[n] + bias[n], an activation, a
// (gated) residual, and an f32 or bf16 store.
// Micro-kernels: AMX-INT8 (32 x 32 on tiles), AVX512-VNNI (14 x 32), AVX-VNNI (6 x 16 on ymm, for
// AVX2-class CPUs that have it), AVX2 without VNNI (6 x 8, vpmaddwd on widened lanes), and a
// portable one; each in its own file compiled for its ISA.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "ops/gemm/cpu_caches.h"
#include "ops/gemm/int8_kernels.h"
#include "tensor/allocated_array.h"

namespace cubevec::ops::gemm {

enum class Int8Isa { amx, avx512_vnni, avx_vnni, avx2, portable };
bool int8_isa_supported(Int8Isa isa);
std::string_view int8_isa_name(Int8Isa isa);
std::optional<Int8Isa> parse_int8_isa(std::string_view name);
// The int8 ISA CUBEVEC_INT8_ISA=amx|avx512_vnni|avx_vnni|avx2|portable forces (read once; an unknown or
// unsupported one is an Error), or nullopt: the calibration chooses.
std::optional<Int8Isa> forced_int8_isa();
// The widest int8 ISA this CPU has, or the forced one.
Int8Isa best_int8_isa();
// The int8 kernel weights packed for `threads` Cube threads use: the forced one, else the
// calibration's choice for large shapes (measured now if the tuning file has none; ops/gemm/tuner.h).
Int8Isa chosen_int8_isa(int threads);

// K in quads as `isa`'s packing pads it: to whole quads, and for AMX to whole 64-deep tiles. The
// activations are quantized to 4 x int8_k_quads(K, isa) columns.
int64_t int8_k_quads(int64_t k, Int8Isa isa);

// W [N, K] s8 packed once into the micro-kernel's panels: NR columns per panel, K in quads
// (4 consecutive k of one column in one 32-bit lane), zero-padded; with the column sums.
struct PackedInt8 {
  int64_t n = 0, k = 0, k_quads = 0;  // K padded as int8_k_quads says, in quads
  Int8Isa isa = Int8Isa::portable;
  int nr = 0;
  // In the caching allocator (counted in its peak and under its limit).
  AllocatedArray<int8_t> panels;        // [ceil(N / NR)][k_quads][NR][4]
  AllocatedArray<int32_t> column_sums;  // sum_k w[n][k], [N]
  // A shape-only packing (simulate mode: no data) counts the bytes its data would take, so the
  // cost model and the memory report see the weight traffic.
  std::size_t bytes() const {
    if (panels.empty() && n > 0) return static_cast<std::size_t>(n) * static_cast<std::size_t>(4 * k_quads + sizeof(int32_t));
    return panels.size() + column_sums.size() * sizeof(int32_t);
  }
};
std::shared_ptr<const PackedInt8> pack_int8_weight(const int8_t* w, int64_t n, int64_t k, int64_t ldw, Int8Isa isa);

// Writes rows [r0, r1) of the activations quantized (u8 rows of `ld_out` bytes, the packing's padded
// K) into `out` and their scales into row_scale[0, r1 - r0): the activation quantization fused into
// the packing of A (the GEMM quantizes each block of rows as it packs it, so the quantized
// activations never make a pass through memory of their own).
using QuantizeRows = std::function<void(int64_t r0, int64_t r1, uint8_t* out, int64_t ld_out, float* row_scale)>;

struct Int8Problem {
  int64_t m = 0, n = 0;
  const uint8_t* a = nullptr;  // [M, packed.k_quads * 4] u8 (s8 + 128), row stride lda
  int64_t lda = 0;
  // Instead of `a`: float activations quantized block by block while A is packed; the epilogue then
  // takes the row scales it produced (epilogue.row_scale is ignored).
  QuantizeRows quantize_rows;
  const PackedInt8* b = nullptr;
  float* c = nullptr;  // [M, N] f32 (with rest.out_bf16 set, an f32 scratch), row stride ldc
  int64_t ldc = 0;
  Int8Epilogue epilogue;
};

// Runs on the calling TBB arena over up to `threads` tasks, with the A block the calibration chose
// for the packed weight's kernel, this shape class and thread count.
void gemm_int8(const Int8Problem& p, int threads);
// With the packed A block taking L2 / l2_share (calibration, tests, benchmarks). Every share gives
// the same bits: the sums are exact and each output element's epilogue is the same.
void gemm_int8_variant(const Int8Problem& p, int threads, int l2_share, const CpuCaches& caches = this_cpu_caches());

}  // namespace cubevec::ops::gemm
