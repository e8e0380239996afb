// The plug points of a model forward. A model receives a ForwardContext with its inputs and knows
// nothing of the stages behind it: a step cache, sparse attention, sequence parallelism or an
// offloader act through these few interfaces, so adding one never means editing a model.
//   - step info: which denoising step this forward belongs to, and which CFG branch;
//   - attention policy: every attention module call goes through it with an identity, and may be
//     replaced (another kernel), skipped (a replayed output) or sparsified per layer;
//   - block hook: every transformer block runs through it (one flat index over all of a model's
//     blocks), so a stage can skip a span of blocks and replay their residual;
//   - sequence split: after the prologue a model hands its tokens to it (sequence parallelism keeps
//     this rank's share), and before the epilogue gets them back whole;
//   - tensor split: a norm over all heads' channels (Wan's q / k RMSNorm) goes through it, since
//     under tensor parallelism a rank holds only its heads' channels;
//   - activation dtype: what the model computes in (f32, or bf16 with f32 accumulation).
// The layer registry (ParameterTable::linears) is the fourth plug point: it is reached after load.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>

#include "device/stream.h"
#include "models/shared_embeddings.h"
#include "base/enum_names.h"
#include "tensor/tensor.h"

namespace cubevec::models {

// Which classifier-free-guidance branch a forward computes: the conditional, the unconditional,
// or both as one batch of 2 (conditional first).
enum class CfgBranch { cond, uncond, both };
inline constexpr auto kCfgBranchNames =
    enum_names<CfgBranch>("CFG branch", {{CfgBranch::cond, "cond"}, {CfgBranch::uncond, "uncond"}, {CfgBranch::both, "both"}});

struct StepInfo {
  int index = 0;       // denoising step, from 0
  int count = 1;       // steps in the run
  float timestep = 0;  // the scheduler's timestep (0..1000)
  float sigma = 0;     // the scheduler's sigma at this step
  CfgBranch branch = CfgBranch::cond;
};

enum class AttentionKind { self, cross, joint };  // joint: [text; image] tokens attend together (Flux)
inline constexpr auto kAttentionKindNames = enum_names<AttentionKind>(
    "attention kind", {{AttentionKind::self, "self"}, {AttentionKind::cross, "cross"}, {AttentionKind::joint, "joint"}});

// Who is attending: enough for a stage to choose per layer and to know the token layout.
struct AttentionIdentity {
  int block = 0;   // flat block index (Flux: double blocks, then single blocks)
  int blocks = 0;  // blocks in the model
  AttentionKind kind = AttentionKind::self;
  int64_t text_len = 0;                  // joint: the first text_len query/key tokens are text; cross: the key length
  std::array<int64_t, 3> grid{1, 1, 1};  // latent token grid (t, h, w) of the image / video tokens
  std::string module;                    // diffusers module name, e.g. "transformer_blocks.3.attn"
};

// q [B, Sq, heads, head_dim] and k, v [B, Sk, heads, head_dim] (BSND), RoPE applied.
struct AttentionQkv {
  Tensor q, k, v;
};
// Computes q, k, v: the module's projections, norms and RoPE. A policy that replays a cached
// output never calls it, so the projections are skipped too.
using AttentionProjection = std::function<AttentionQkv()>;

// Every attention module call: returns the attention output [B, Sq, heads * head_dim] (before the
// module's output projection, which is linear, so replaying this output equals replaying the
// projected one).
class AttentionPolicy {
 public:
  virtual ~AttentionPolicy() = default;
  virtual Tensor attend(const StepInfo& step, const AttentionIdentity& id, const AttentionProjection& project, const Stream& stream) = 0;
};

// What the default policy runs: ops::attention_forward (runtime-tuned) on BSND q, k, v.
Tensor dense_attention(const AttentionQkv& qkv, const Stream& stream);

// The state between transformer blocks: the image / video tokens and, in models that keep a text
// stream (Flux), the text tokens.
struct BlockState {
  Tensor hidden;   // [B, N, D]
  Tensor encoder;  // [B, L, D] or undefined
};

struct BlockIdentity {
  int index = 0;       // flat block index
  int count = 0;       // blocks in the model
  std::string module;  // "transformer_blocks.3", "single_transformer_blocks.0", "blocks.7"
  int model = 0;       // which of the pipeline's transformers (1: Wan2.2 A14B's transformer_2)
};
using BlockCompute = std::function<BlockState(const BlockState&)>;

// Every transformer block: `compute` runs the block; a hook may call it, or not (replaying a
// cached residual), or wrap it (prefetch weights, time it).
class BlockHook {
 public:
  virtual ~BlockHook() = default;
  virtual BlockState run(const StepInfo& step, const BlockIdentity& id, const BlockState& in, const BlockCompute& compute,
                         const Stream& stream) = 0;
};

// Sequence parallelism's plug point. split: state.hidden [B, N, D] keeps this rank's share of the
// image / video tokens, and `rope` (its first `text_rows` rows are text, kept whole) the matching
// rows; join: state.hidden becomes all N tokens again, in order. keep_tokens: of a per-token tensor
// [B, N, ...] (all N tokens), the rows the last split kept of the hidden state (Wan2.2 TI2V's
// per-token timestep masks).
class SequenceSplit {
 public:
  virtual ~SequenceSplit() = default;
  virtual void split(BlockState& state, RopeTable& rope, int64_t text_rows, const Stream& stream) = 0;
  virtual void join(BlockState& state, const Stream& stream) = 0;
  virtual Tensor keep_tokens(const Tensor& per_token, const Stream& stream) const = 0;
};

// Tensor parallelism's plug point. x [..., C / T] holds this rank's share of the channels and
// weight [C / T] the matching norm weights: returns x * rsqrt(mean over all C channels of x^2 + eps)
// * weight, the sum of squares reduced over the ranks.
class TensorSplit {
 public:
  virtual ~TensorSplit() = default;
  virtual Tensor rms_norm_across_heads(const Tensor& x, const Tensor& weight, float eps, const Stream& stream) = 0;
};

struct ForwardContext {
  StepInfo step{};
  AttentionPolicy* attention = nullptr;  // null: dense attention everywhere
  BlockHook* blocks = nullptr;           // null: every block computed
  SequenceSplit* sequence = nullptr;     // null: every rank (there is one) holds every token
  TensorSplit* tensor = nullptr;         // null: every rank holds every channel
  DType activations = DType::f32;        // f32, or bf16 (inputs cast at the prologue)

  Tensor attend(const AttentionIdentity& id, const AttentionProjection& project, const Stream& stream) const {
    return attention ? attention->attend(step, id, project, stream) : dense_attention(project(), stream);
  }
  BlockState run_block(const BlockIdentity& id, const BlockState& in, const BlockCompute& compute, const Stream& stream) const {
    return blocks ? blocks->run(step, id, in, compute, stream) : compute(in);
  }
  void split_sequence(BlockState& state, RopeTable& rope, int64_t text_rows, const Stream& stream) const {
    if (sequence) sequence->split(state, rope, text_rows, stream);
  }
  void join_sequence(BlockState& state, const Stream& stream) const {
    if (sequence) sequence->join(state, stream);
  }
  Tensor rms_norm_across_heads(const Tensor& x, const Tensor& weight, float eps, const Stream& stream) const;
};

// Throws unless `activations` is f32 or bf16.
void check_activation_dtype(DType activations);

}  // namespace cubevec::models
