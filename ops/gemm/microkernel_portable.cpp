// Baseline x86-64: plain loops the compiler vectorizes with SSE2.
#include "ops/gemm/microkernel.h"

namespace cubevec::ops::gemm {

void microkernel_portable(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool accumulate) {
  constexpr int MR = kMrPortable, NR = kNrPortable;
  float acc[MR][NR] = {};
  for (int64_t k = 0; k < kc; ++k) {
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) acc[r][j] += a[r] * b[j];
    a += MR;
    b += NR;
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) c[r * ldc + j] = accumulate ? c[r * ldc + j] + acc[r][j] : acc[r][j];
}

}  // namespace cubevec::ops::gemm

#include "ops/gemm/epilogue_impl.h"

namespace cubevec::ops::gemm {

void epilogue_portable(const Epilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows, int64_t cols) {
  apply_epilogue(ep, c, ldc, i0, j0, rows, cols);
}

}  // namespace cubevec::ops::gemm
