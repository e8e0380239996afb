// Register-blocked GEMM micro-kernels: C[MR x NR] (+)= A_panel x B_panel over kc, where the A panel
// is packed k-major (kc x MR) and the B panel k-major (kc x NR). Each ISA has its own file, compiled
// with that ISA's flags and called only when the CPU has it; these files include no C++ library
// headers, so no inline library code compiled for a wider ISA can leak into the rest of the program.
#pragma once

#include <cstdint>

namespace cubevec::ops::gemm {

// accumulate == false: C = A x B; true: C += A x B. ldc in elements.
using MicroKernel = void (*)(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate);

// AVX-512: 14 rows x 32 columns (28 zmm accumulators).
inline constexpr int kMrAvx512 = 14, kNrAvx512 = 32;
void microkernel_avx512(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate);
// The same, prefetching the panels kPrefetchAvx512 k steps ahead (16 and 32 measured alike on a
// 2-core Xeon, both 10-20% above none; 8 in between).
inline constexpr int kPrefetchAvx512 = 16;
void microkernel_avx512_prefetch(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate);
// Both for a partial tile of `rows` (1 to 14) rows of C, the A panel still 14 rows wide (zero past
// `rows`): they compute 4, 8 or 14 rows and write only `rows`.
void microkernel_avx512_rows(int rows, int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate);
void microkernel_avx512_prefetch_rows(int rows, int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate);

// AVX2 + FMA: 6 rows x 16 columns (12 ymm accumulators).
inline constexpr int kMrAvx2 = 6, kNrAvx2 = 16;
void microkernel_avx2(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate);

// Any x86-64 (SSE2 baseline, auto-vectorized): 4 rows x 16 columns.
inline constexpr int kMrPortable = 4, kNrPortable = 16;
void microkernel_portable(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate);

}  // namespace cubevec::ops::gemm
