// The peak memory a generation request will need, estimated from the config files alone (a meta
// pipeline: shapes, no weights) so a request that cannot fit is refused before anything loads:
//   weights      every parameter at the dtype it is stored in (bf16 matrices, f32 vectors and VAE)
//   packed       the transformer Linears' GEMM panels (f32, or bf16 for the AMX and AVX512-BF16
//                kernels), made on first use and kept
//   with --offload R, the transformer blocks' weights and panels count only for the blocks that
//   can be in memory at once: R resident, R packed ahead and two in flight
//   denoising    the transformer's live activations at its widest point (a block's q, k, v,
//                attention output, MLP hidden and the residual stream, for the CFG batch)
//   VAE decode   the decoder's live activations at full resolution (Wan: one chunk of frames plus
//                the causal convolutions' frame cache)
// The peak is weights + packed + the larger of the two phases. The counts of live tensors per block are
// read off the forward code and checked against the allocator's measured peak per phase in
// tests/cli/memory_cli_test.cpp: the estimate must bound the measurement from above without being
// more than a few times larger.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/parameters.h"

namespace cubevec::pipelines {

struct MemoryEstimate {
  uint64_t weights = 0, packed = 0, denoising = 0, vae_decode = 0;
  uint64_t peak() const { return weights + packed + (denoising > vae_decode ? denoising : vae_decode); }
  // "12.3 GiB (weights 11.1 GiB + denoising 1.2 GiB; VAE decode 0.9 GiB)"
  std::string describe() const;
};

// Each family estimates its own requests (ModelPipeline::estimate_memory, in its
// pipelines/<family>_family.cpp) from these building blocks.

// Flash attention's per-thread tiles, the GEMM's packing buffers and the allocator's size-class
// rounding: a fixed allowance on top of the counted tensors.
inline constexpr uint64_t kWorkspaceBytes = uint64_t{64} << 20;

// Every parameter as it is stored: matrices and kernels as `dtype`, vectors (and keep_f32 tables) f32.
uint64_t stored_bytes(const models::ParameterTable& table, DType dtype);

// A transformer's weights and packed GEMM panels (`block_modules`: its blocks' module names, in
// order). With offload R (`offload` > 0) the blocks count only for those that can be in memory at
// once: R resident, R packed ahead, two in flight. `cube_threads`: what the GEMM kernels are
// calibrated for (the packed panels' layout depends on the kernel).
struct TransformerBytes {
  uint64_t weights = 0, packed = 0;
};
TransformerBytes transformer_bytes(const models::ParameterTable& table, const std::vector<std::string>& block_modules, DType dtype,
                                   int offload, int cube_threads);

uint64_t activation_bytes(DType activations);  // 2 for bf16, else 4

// What this process may use: the smaller of MemAvailable (/proc/meminfo) and the cgroup's
// memory.max minus memory.current, when they are readable; 0 when neither is.
uint64_t available_memory_bytes();

// Parses --memory-limit: bytes with an optional K, M, G or T suffix (powers of 1024, optional
// "iB"/"B"): "24G", "512MiB", "1.5G", "1000000". Throws naming the flag (when not empty) and the
// text for anything else.
uint64_t parse_memory_size(const std::string& text, const std::string& flag);

// Throws an Error naming the estimate and the limit when estimate.peak() exceeds `limit_bytes`
// (from `limit_source`, e.g. "--memory-limit 8G" or "the available memory").
void require_fits(const MemoryEstimate& estimate, uint64_t limit_bytes, const std::string& limit_source);

}  // namespace cubevec::pipelines
