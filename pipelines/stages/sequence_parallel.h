// Sequence parallelism, Ulysses and ring attention combined as MindIE SD (and xDiT's USP) combine
// them: the image / video tokens are shared by ulysses x ring ranks through every block.
//
// - Ulysses (DeepSpeed-Ulysses): around each attention an all-to-all trades the sequence split for a
//   head split (every rank of the Ulysses group attends over the group's tokens with heads / U of
//   the heads) and a second one trades it back. The head count must divide by U.
// - Ring attention: each ring member holds one span of the tokens. It attends its queries to its own
//   K/V, passes K/V to the next member while receiving the previous member's, and attends to those,
//   R times; the partial results are merged by their log-sum-exps (ops::merge_attention_partials).
//   The next transfer runs on the comm unit while the current block is attended.
// - The token shares are split_sizes(N, U x R) in the order (ring index, ulysses index), so N need
//   not divide; every rank needs at least one token.
// - Flux's text tokens stay whole on every rank: for Ulysses their q, k, v are narrowed to the
//   rank's heads (no transfer) and their attention output is all-gathered over the heads; the ring
//   carries only image K/V, so each rank attends to the text keys once.
// - Cross-attention (Wan: video queries, text keys) needs no transfer: every rank has the text.
// - It must be the first attention stage, so the stages below see all tokens for the rank's heads.
//   Ring attention computes the attention itself, so no attention stage may follow it.
#pragma once

#include <map>

#include "parallel/communicator.h"
#include "pipelines/stage.h"

namespace cubevec::pipelines {

class SequenceParallelStage : public Stage, public models::SequenceSplit {
 public:
  SequenceParallelStage(parallel::Communicator ulysses, parallel::Communicator ring);

  std::string name() const override;  // "ulysses x2", "ring x2", "ulysses x2 ring x2"
  bool uses_attention() const override { return ranks() > 1; }
  bool computes_attention() const override { return ring_.size() > 1; }
  Tensor attend(const models::StepInfo& step, const models::AttentionIdentity& id, const models::AttentionProjection& project,
                const Stream& stream, const AttendNext& next) override;
  models::SequenceSplit* sequence_split() override { return ranks() > 1 ? this : nullptr; }

  void split(models::BlockState& state, models::RopeTable& rope, int64_t text_rows, const Stream& stream) override;
  void join(models::BlockState& state, const Stream& stream) override;
  Tensor keep_tokens(const Tensor& per_token, const Stream& stream) const override;

  std::string summary() const override;
  nlohmann::ordered_json report() const override;

 private:
  int ranks() const { return ulysses_.size() * ring_.size(); }
  // q, k, v [B, text + the ring member's tokens, heads, head_dim]: attention over every ring member's keys.
  Tensor ring_attention(const models::AttentionIdentity& id, const models::AttentionQkv& qkv, int64_t text, const Stream& stream);

  parallel::Communicator ulysses_, ring_;
  std::vector<int64_t> token_sizes_;                               // the shares of this rank's Ulysses group, in its rank order
  std::vector<int64_t> ring_sizes_;                                // each ring member's span (its Ulysses group's tokens)
  int64_t token_offset_ = 0, token_count_ = 0, split_tokens_ = 0;  // the last split: this rank's rows of how many
  std::map<std::string, int64_t> head_dim_;                        // per attention module, from its last projection
  int64_t all_to_all_calls_ = 0, ring_transfers_ = 0;
};

}  // namespace cubevec::pipelines
