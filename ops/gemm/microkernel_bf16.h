// bf16 GEMM micro-kernels (AVX512-BF16 and AMX-BF16): C (+)= A x B with bf16 inputs and f32 sums.
// AVX512-BF16: C[12 x 32].
// Panels are packed in k pairs: A as kc/2 x MR pairs (a[r][k], a[r][k+1]); B as kc/2 x NR pairs
// (b[k][j], b[k+1][j]), which is the operand layout of vdpbf16ps. No C++ library headers here
// (see microkernel.h for why).
#pragma once

#include <cstdint>

namespace cubevec::ops::gemm {

inline constexpr int kMrBf16 = 12, kNrBf16 = 32;
// kpairs = kc / 2 (kc padded to even with zeros). Called only on CPUs with AVX512-BF16.
void microkernel_bf16_avx512(int64_t kpairs, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc, bool accumulate);
// The same for a partial tile of `rows` (1 to 12) rows of C, the A panel still kMrBf16 rows wide
// (zero past `rows`): it computes 4, 8 or 12 rows and writes only `rows` (a 256-row GEMM's last
// 4 rows cost as much as 12 through the full kernel: 8% of 256 x 3072 x 3072 on a Zen 4).
void microkernel_bf16_avx512_rows(int rows, int64_t kpairs, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc, bool accumulate);

// AMX-BF16: C[32 x 32] (+)= A x B on tiles (four 16 x 16 f32 accumulators). A is packed in k blocks
// of 32: kc/32 x MR rows x 32 k (each block two A tiles); B as for the AVX512-BF16 kernel (kc/2 x
// NR pairs), read as two B tiles of 16 columns. kpairs must be a multiple of 16 (kc padded to 32
// with zeros). Called only where amx_ready() said yes.
inline constexpr int kMrAmx = 32, kNrAmx = 32;
void microkernel_bf16_amx(int64_t kpairs, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc, bool accumulate);
// n (0 to 32) f32 values rounded to bf16 (nearest even) with AVX512-BF16: one row of an A tile
// packed from f32 activations (every AMX CPU has AVX512-BF16).
void f32_to_bf16_block_amx(const float* src, uint16_t* dst, int n);
// The AMX kernel on the tile model (ops/gemm/amx_model.h; microkernel_amx_model.cpp).
namespace amx_model {
void microkernel_bf16_amx(int64_t kpairs, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc, bool accumulate);
}

}  // namespace cubevec::ops::gemm
