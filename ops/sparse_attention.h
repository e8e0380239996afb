// MindIE SD's sparse_attention (docs/ops.md, "MindIE SD's sparse_attention"; read against
// mindiesd/layers/flash_attn/sparse_flash_attn*.py and csrc/ops/sparse_block_estimate): a block
// mask estimated from q and k picks the 128 x 128 blocks the block-sparse flash kernel
// (ops::block_sparse_attention) computes.
//
//   rf_v2 (RainFusion 2.0): the image tokens are reordered into 8 x 8 spatial tiles per frame
//     (frame 0 raster when h or w is not a multiple of 8), text moved after them; q and k are
//     mean-pooled over 128-token blocks (image and text separately); softmax(q_pool k_pool^T *
//     scale) per batch and head; each query block keeps its ceil(L * (1 - sparsity)) best key
//     blocks (ties all kept), text and first-frame blocks are kept whole (rows and columns); the
//     kernel uses batch 0's mask for every batch (as MindIE); then the inverse reorder.
//   ada_bsa: strided antidiagonal estimate (groups of 8 tokens, each query group reversed, scale /
//     8), softmax over key groups, summed into 128 x 128 blocks; per query block the smallest set
//     of key blocks whose estimated mass reaches cdf_threshold, capped at int(L * (1 - sparsity))
//     when L >= 10 (in float32, as the kernel's attributes: L = 10 at 0.8 keeps 2); the first key
//     block always kept, the last (and with keep_sink the first) forced; per batch and head.
//   none: dense attention.
//
// Numerics are f32 (MindIE rounds pooled scores to bf16 / fp16 on the NPU, so masks may differ
// where scores tie or sit at a threshold). The estimate and the attention are separate calls so a
// caller may reuse a mask across steps (RainFusion v3's mask reuse; pipelines/stages/sparse_attention.h).
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ops/attention.h"

namespace cubevec::ops {

enum class SparseType { none, rf_v2, ada_bsa };
SparseType parse_sparse_type(std::string_view name);  // "none", "rf_v2", "ada_bsa" (rf_v3 is named as rf_v2 with mask reuse)
std::string_view sparse_type_name(SparseType type);

using LatentShape = std::array<int64_t, 3>;  // (t, h, w) latent tokens of the image / video part

struct SparseAttentionOptions {
  SparseType sparse_type = SparseType::none;
  double sparsity = 0.0;                                      // [0, 1]; 0 is dense attention through the sparse path
  int64_t txt_len = 0;                                        // the first txt_len tokens are text (rf_v2)
  std::optional<LatentShape> latent_shape_q, latent_shape_k;  // rf_v2: (t, h, w) with t * h * w = S - txt_len
  bool keep_sink = true, keep_recent = true;                  // ada_bsa
  double cdf_threshold = 1.0;                                 // ada_bsa: (0, 1]; 1 disables the CDF cut
  AttentionLayout input_layout = AttentionLayout::bnsd;       // BNSD or BSND, as MindIE's default
  std::optional<double> scale{};                              // default D^-0.5
  int64_t head_num = 0;                                       // must equal q's heads when given (0: q's)
  int inner_precise = 0;                                      // MindIE's NPU precision mode, 0..4: accepted, no effect here (f32 sums)
  int64_t block_size = 128;                                   // the only size MindIE supports
};

// What the estimation found, filled when its kernel has run (not in simulate mode).
struct SparseMaskStats {
  std::atomic<int64_t> kept{0}, total{0};  // kept block pairs of the kernel's mask, of all
  std::atomic<bool> ready{false};
};

struct SparseMask {
  SparseType type = SparseType::none;
  // u8 [B, N, Lq, Lk], each batch's own mask (rf_v2: [B, N, L, L] over the pooled blocks of the
  // reordered sequence, as MindIE's get_blockwise_mask; ada_bsa: the estimate's). Undefined for none.
  Tensor kept_blocks;
  // What the block-sparse kernel walks: ada_bsa kept_blocks; rf_v2 batch 0's first ceil(S/128)
  // pooled blocks, [1, N, Lk, Lk], for every batch (MindIE hands rain_fusion_attention mask[0]).
  Tensor kernel_mask;
  double expected_density = 1.0;  // the kept fraction the cost model assumes (from the shapes)
  std::shared_ptr<SparseMaskStats> stats = std::make_shared<SparseMaskStats>();
  // rf_v2 when the image length is not a multiple of 128 and there is text: MindIE's pooled
  // text blocks do not line up with the kernel's blocks (its indices are used verbatim, as MindIE).
  std::string note;
};

// Checks every option against q, k, v (errors name the argument); returns the validated options
// (head_num and latent_shape_k filled in).
SparseAttentionOptions check_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SparseAttentionOptions& options);

SparseMask estimate_sparse_mask(const Tensor& q, const Tensor& k, const SparseAttentionOptions& options,
                                const Stream& stream = default_op_stream());
// The attention with a mask from estimate_sparse_mask on q, k of the same shapes (possibly of an
// earlier step): rf_v2 reorders q, k, v, runs the kernel, and reorders the result back.
Tensor sparse_attention_with_mask(const Tensor& q, const Tensor& k, const Tensor& v, const SparseMask& mask,
                                  const SparseAttentionOptions& options, const Stream& stream = default_op_stream());

struct SparseAttentionResult {
  Tensor out;          // q's layout, shape and dtype
  Tensor kept_blocks;  // SparseMask::kept_blocks
  std::string note;
};
SparseAttentionResult sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SparseAttentionOptions& options,
                                       const Stream& stream = default_op_stream());

}  // namespace cubevec::ops
