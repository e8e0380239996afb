// Attention with MindIE SD's semantics (docs/ops.md, "MindIE SD's attention_forward").
//
//   out = softmax(scale * q k^T + bias) v,   bias = 0 where the mask is true (attend), -inf where false
//                                            (or the f32 mask itself, see AttentionOptions::mask)
//
// Three implementations, all f32 or bf16 in and out, sums and softmax in f32:
//   math:          materialized [Sq, Sk] scores per head, then softmax, then P v; MindIE's
//                  attention_math, the reference. bf16 rounds where MindIE does: q*scale, the
//                  scores, and the probabilities are rounded to bf16 before their next use.
//   flash:         tiled flash attention with an online softmax; the Cube unit's threads run
//                  QK^T, the softmax update and PV tile by tile (packed K/V, register-blocked
//                  kernels, any head dim padded only inside the kernel).
//   cv_pipelined:  the same tiles split across the units: QK^T and PV on the Cube unit, scale /
//                  mask / online softmax on the Vector unit, handed over through bounded
//                  double-buffered queues (Ascend's TQue pattern, docs/device.md, "Ascend's AI
//                  Core, as the device imitates it"). If the Vector unit is busy elsewhere the
//                  Cube side does the softmax itself, so the pair can never deadlock.
// A row whose mask is false everywhere has no defined softmax: every implementation returns NaN
// for it, as MindIE's math path does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ops/op_stream.h"

namespace cubevec::ops {

// How q, k, v (and the result) are laid out: BSND [B, S, N, D] (MindIE's head_first=false), BNSD
// [B, N, S, D] (head_first=true), BSH [B, S, N*D] (needs AttentionOptions::num_heads).
enum class AttentionLayout { bsnd, bnsd, bsh };
AttentionLayout parse_attention_layout(std::string_view name);   // "BSND", "BNSD", "BSH" (any case)
std::string_view attention_layout_name(AttentionLayout layout);  // "BSND", ...
// The sequence and head dimensions of a 4-D BSND or BNSD tensor (BSH is viewed as BSND).
inline int64_t seq_dim(AttentionLayout layout) { return layout == AttentionLayout::bnsd ? 2 : 1; }
inline int64_t head_dim_index(AttentionLayout layout) { return layout == AttentionLayout::bnsd ? 1 : 2; }

// flash_bf16: flash attention whose Q K^T and P V are bf16 tile products on AMX-BF16 (or, without
// AMX, AVX512-BF16 dot products; f32 sums and online softmax); q, k, v are rounded to bf16 and so
// is P. Offered to the autotuner for bf16 activations on CPUs with either; elsewhere asking for it
// is an error.
// flash_int8: flash_bf16 with Q K^T in int8 on AMX-INT8, quantized as SageAttention does (K smoothed
// by its channel means, one scale per 128-key block of K and per 32-row panel of Q); P V in bf16.
// Lossy beyond the activations' own rounding: never chosen by the autotuner, only by name (or a
// stage that asks: --quant-attention int8).
enum class AttentionImpl { math, flash, cv_pipelined, flash_bf16, flash_int8 };
AttentionImpl parse_attention_impl(std::string_view name);  // "math", "flash", "cv_pipelined", "flash_bf16", "flash_int8"
std::string_view attention_impl_name(AttentionImpl impl);
// Whether this CPU can run `impl` (flash_bf16 needs AMX-BF16 or AVX512-BF16, flash_int8 AMX-INT8
// and AMX-BF16; the others run everywhere).
bool attention_impl_available(AttentionImpl impl);
// What opt_mode static runs for activations of `dtype` (flash_bf16 for bf16 on an AMX CPU, else flash).
AttentionImpl attention_static_impl(DType activations);

// MindIE's opt_mode: runtime (time the candidates on the first call for a key, keep the fastest),
// static (a fixed table), manual (op_type and kernel_layout as given).
enum class AttentionOptMode { runtime, static_table, manual };
AttentionOptMode parse_attention_opt_mode(std::string_view name);  // "runtime", "static", "manual"
std::string_view attention_opt_mode_name(AttentionOptMode mode);

struct AttentionOptions {
  // Boolean (DType::boolean), true = attend: [Sq, Sk], or [B, N, Sq, Sk] (dims of size 1 broadcast).
  // Or f32, an additive bias (PyTorch SDPA's float attn_mask; MindIE SD's masks are boolean only):
  // added to the scaled scores in f32 (after their bf16 rounding on the math path); -inf masks a
  // key. T5's relative position bias arrives this way.
  Tensor mask{};
  std::optional<double> scale{};  // default D^-0.5
  AttentionLayout layout = AttentionLayout::bsnd;
  int64_t num_heads = 0;  // BSH only
  AttentionOptMode opt_mode = AttentionOptMode::runtime;
  // manual only: the implementation, and the layout handed to the kernel (q, k, v are copied into
  // it when it differs from `layout`; BSH is handed over as BSND).
  AttentionImpl op_type = AttentionImpl::flash;
  AttentionLayout kernel_layout = AttentionLayout::bnsd;
};

// q [B, Sq, N, D], k and v [B, Sk, N, D] in BSND (or the other layouts), same dtype (f32 or bf16);
// Sq may differ from Sk (cross-attention). Returns q's layout, shape and dtype.
Tensor attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options = {},
                         const Stream& stream = default_op_stream());

// Attention with each query row's log-sum-exp: what ring attention computes per block of keys and
// then merges. out as attention_forward; lse f32 [B, N, Sq], log(sum_j exp(score_ij)) over the
// scaled (and masked) scores of the keys the row saw, -inf for a row that saw none (its out is NaN).
struct AttentionPartial {
  Tensor out;
  Tensor lse;
};
// As attention_forward (BSND or BNSD) on the tiled kernels: flash or cv_pipelined as opt_mode picks
// (the math path has no log-sum-exp; in manual mode op_type must not be math).
AttentionPartial attention_forward_with_lse(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options = {},
                                            const Stream& stream = default_op_stream());
// The result over the union of two disjoint key sets from the result over each (same q, layout
// BSND or BNSD, same shapes and dtype), in f32 on the Vector unit:
//   lse = log(exp(lse_a) + exp(lse_b)),   out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b.
// A part whose row has lse -inf adds nothing (its NaN out is ignored); a row neither part saw stays NaN.
AttentionPartial merge_attention_partials(const AttentionPartial& a, const AttentionPartial& b,
                                          AttentionLayout layout = AttentionLayout::bsnd, const Stream& stream = default_op_stream());

// Block-sparse attention, the kernel under MindIE SD's sparse_attention (ops/sparse_attention.h):
// the flash tiles (and their CV-pipelined form) walk only the key blocks each query block keeps.
// block_mask is bool or u8 [B, N, ceil(Sq/128), ceil(Sk/128)] (B and N may be 1 to broadcast), true
// = query block qb attends to key block kb; within kept blocks the softmax is exact. A query block
// that keeps nothing gives zero rows (MindIE's kernel for a count of 0). An all-true mask gives
// bit for bit the flash result. q, k, v as attention_forward (BSND or BNSD, f32 or bf16).
struct BlockSparseOptions {
  std::optional<double> scale{};                          // default D^-0.5
  AttentionLayout layout = AttentionLayout::bsnd;         // bsnd or bnsd
  AttentionOptMode opt_mode = AttentionOptMode::runtime;  // tuned between flash and cv_pipelined, BSND and BNSD
  AttentionImpl op_type = AttentionImpl::flash;           // manual: flash or cv_pipelined
  AttentionLayout kernel_layout = AttentionLayout::bnsd;  // manual
  // The kept fraction of the block pairs, for the cost model; by default counted from the mask
  // (which waits for it), or 1 for a shape-only mask (simulate mode).
  std::optional<double> density{};
};
Tensor block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& block_mask,
                              const BlockSparseOptions& options = {}, const Stream& stream = default_op_stream());

// Packed variable-length sequences: q [Tq, N, D], k and v [Tk, N, D]; sequence b holds rows
// cu_seqlens_q[b] .. cu_seqlens_q[b+1] of q and cu_seqlens_k[b] .. cu_seqlens_k[b+1] of k and v.
// cu_seqlens_* are int32 [B+1], starting at 0, non-decreasing, ending at Tq (Tk). causal: query i of a
// sequence attends to key j when j <= i + (Sk_b - Sq_b) (bottom-right aligned, as flash-attn and
// Ascend's sparse_mode 3). A sequence with queries but no keys is an error; a causal row that
// sees no key (Sq_b > Sk_b) comes out NaN. Returns [Tq, N, D] in q's dtype.
struct VarlenOptions {
  std::optional<double> scale{};
  bool causal = false;
  AttentionImpl impl = AttentionImpl::flash;  // any implementation; math is the reference
};
Tensor attention_forward_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                const VarlenOptions& options = {}, const Stream& stream = default_op_stream());

}  // namespace cubevec::ops
