// Cube kernels: matrix multiplication with fused epilogues.
//   C[M, N] = A[M, K] x B[K, N]   (or B given as a Linear weight W[N, K]: C = A W^T)
//   then C = act(C + bias + low_rank_a low_rank_b), then C = residual + gate * C   (each step optional)
#pragma once

#include <string_view>

#include "ops/gemm/driver.h"
#include "ops/op_stream.h"

namespace cubevec::ops {

enum class GemmBackend {
  cubevec,    // cubevec's register-blocked micro-kernels (AVX-512, AVX2 or portable, chosen at run time)
  openblas,   // OpenBLAS sgemm, one thread per call, the work split over the Cube unit's threads
  eigen,      // Eigen's product, likewise split
  reference,  // a plain loop in double precision: the oracle for tests, not for speed
};

GemmBackend parse_gemm_backend(std::string_view name);  // "cubevec", "openblas", "eigen", "reference"
std::string_view gemm_backend_name(GemmBackend backend);

using GemmActivation = gemm::Activation;

struct MatmulOptions {
  Tensor bias{};  // [N]
  // A low-rank update before the activation: C += low_rank_a low_rank_b, f32 [M, R] (or [Bt, M, R])
  // and [R, N] (a runtime LoRA, models/lora_runtime.h). The float GEMMs only, not the int8 kernels.
  Tensor low_rank_a{}, low_rank_b{};
  GemmActivation activation = GemmActivation::none;
  Tensor residual{};         // [M, N], f32 or bf16
  Tensor gate{};             // [N]; needs residual
  bool b_is_weight = false;  // b is W [N, K] and C = A W^T (PyTorch's Linear layout)
  // f32, or bf16: inputs rounded to bf16, products summed in f32 (cubevec and reference backends).
  DType compute = DType::f32;
  GemmBackend backend = GemmBackend::cubevec;
  // b already packed by pack_weight (cubevec backend): the GEMM skips packing it on every call.
  std::shared_ptr<const gemm::PackedB> packed_weight{};
  // The result's dtype: f32, or bf16 (summed in f32, the epilogue applied in f32, rounded once).
  DType out = DType::f32;
  // With an i8 weight (b_is_weight): the per-output-channel scale [N], f32; the weight is read as
  // int8 x scale while packed (a weight-only quantized Linear; no float copy of it is kept).
  Tensor b_scale{};
};

// Packs a weight W [N, K] (b_is_weight layout, f32 or bf16) once for matmul with `compute`, on the
// calling thread, for the bf16 kernel calibrated for `threads` Cube threads (0: the calling
// arena's). The packed copy does not follow later changes to W.
std::shared_ptr<const gemm::PackedB> pack_weight(const Tensor& weight, DType compute = DType::f32, int threads = 0);

// A contiguous [M, K]; B contiguous [K, N] (or [N, K] with b_is_weight); each f32 or bf16 (bf16
// inputs need the cubevec or reference backend), or B an i8 weight with options.b_scale. The result is [M, N] of dtype options.out. Runs on
// the Cube unit of `stream`'s device.
Tensor matmul(const Tensor& a, const Tensor& b, const MatmulOptions& options = {}, const Stream& stream = default_op_stream());

// Batched: a [Bt, M, K] with b [Bt, K, N] (or one b [K, N] shared by every batch) -> [Bt, M, N].
// Epilogue tensors (bias, gate: [N]; residual: [Bt, M, N]) apply to every batch.
Tensor bmm(const Tensor& a, const Tensor& b, const MatmulOptions& options = {}, const Stream& stream = default_op_stream());

// PyTorch's Linear: x [..., K], weight [N, K], bias [N] -> [..., N] in x's dtype.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, const Stream& stream = default_op_stream());

// The plain loop behind GemmBackend::reference (epilogue included), for tests and as the oracle.
void gemm_reference(const gemm::Problem& problem);

}  // namespace cubevec::ops
