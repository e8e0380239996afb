// Cube kernels: matrix multiplication. C[M, N] = A[M, K] x B[K, N] (+ bias[N]).
#pragma once

#include <string_view>

#include "ops/op_stream.h"

namespace cubevec::ops {

enum class GemmBackend {
  openblas,   // OpenBLAS sgemm, one thread per call, rows split over the Cube unit's threads
  reference,  // a plain triple loop: the oracle for tests, not for speed
};

GemmBackend parse_gemm_backend(std::string_view name);  // "openblas" or "reference"

// A and B row-major contiguous f32 2-D; bias (if defined) f32 [N]. Runs on the Cube unit.
Tensor matmul(const Tensor& a, const Tensor& b, const Tensor& bias = {}, GemmBackend backend = GemmBackend::openblas,
              const Stream& stream = default_op_stream());

// The plain loop behind GemmBackend::reference, for tests: c = a x b (+ bias), all row-major.
void gemm_reference(const float* a, const float* b, const float* bias, float* c, int64_t m, int64_t n, int64_t k);

}  // namespace cubevec::ops
