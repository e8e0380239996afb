// bf16 GEMM micro-kernel (AVX512-BF16): C[14 x 32] (+)= A x B with bf16 inputs and f32 sums.
// Panels are packed in k pairs: A as kc/2 x MR pairs (a[r][k], a[r][k+1]); B as kc/2 x NR pairs
// (b[k][j], b[k+1][j]), which is the operand layout of vdpbf16ps. No C++ library headers here
// (see microkernel.h for why).
#pragma once

#include <cstdint>

namespace cubevec::ops::gemm {

inline constexpr int kMrBf16 = 12, kNrBf16 = 32;
// kpairs = kc / 2 (kc padded to even with zeros). Called only on CPUs with AVX512-BF16.
void microkernel_bf16_avx512(int64_t kpairs, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc,
                             bool accumulate);

}  // namespace cubevec::ops::gemm
