// Any x86-64: the int8 tile in plain C++ (the compiler vectorizes the 16-column rows at the baseline).
#include "ops/gemm/int8_kernels.h"

namespace cubevec::ops::gemm {

void int8_microkernel_portable(int64_t k_quads, const uint8_t* a, const int8_t* b, int32_t* c, int64_t ldc) {
  constexpr int MR = kMrInt8Portable, NR = kNrInt8Portable;
  int32_t acc[MR][NR] = {};
  for (int64_t q = 0; q < k_quads; ++q) {
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < NR; ++j) {
        int32_t sum = 0;
        for (int t = 0; t < 4; ++t) sum += static_cast<int32_t>(a[4 * r + t]) * static_cast<int32_t>(b[4 * j + t]);
        acc[r][j] += sum;
      }
    a += 4 * MR;
    b += 4 * NR;
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) c[r * ldc + j] = acc[r][j];
}

}  // namespace cubevec::ops::gemm

#include "ops/gemm/int8_epilogue_impl.h"

namespace cubevec::ops::gemm {

void int8_epilogue_portable(const Int8Output& p, const int32_t* acc, int64_t ld_acc, int64_t i0, int64_t j0, int64_t rows, int64_t cols) {
  apply_int8_epilogue(p, acc, ld_acc, i0, j0, rows, cols);
}

}  // namespace cubevec::ops::gemm
