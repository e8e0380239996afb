// cubevec's own f32 GEMM: packing, cache blocking and threads around the ISA's micro-kernel
// (BLIS-style loops: NC columns of B in L3, KC x NC packed B, MC x KC packed A in L2, one NR-wide
// B micro-panel in L1 while the micro-kernel walks the MR-row panels of A).
#pragma once

#include <cstdint>
#include <string_view>

#include "ops/gemm/epilogue.h"

namespace cubevec::ops::gemm {

enum class Isa { avx512, avx2, portable };

// The widest ISA this CPU runs; CUBEVEC_GEMM_ISA=avx2|portable lowers it (for testing and
// comparison). Throws on an unknown or unsupported value.
Isa best_isa();
bool isa_supported(Isa isa);
std::string_view isa_name(Isa isa);

struct Problem {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;  // [M, K], row stride lda
  int64_t lda = 0;
  const float* b = nullptr;  // [K, N] with row stride ldb, or, if trans_b, [N, K] (a Linear weight)
  int64_t ldb = 0;
  bool trans_b = false;
  float* c = nullptr;  // [M, N], row stride ldc
  int64_t ldc = 0;
  Epilogue epilogue;
};

// Runs on the calling thread's TBB arena, splitting the work over up to `threads` tasks.
void sgemm(const Problem& p, Isa isa, int threads);

}  // namespace cubevec::ops::gemm
