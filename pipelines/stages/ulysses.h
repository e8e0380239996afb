// Ulysses sequence parallelism (DeepSpeed-Ulysses, as MindIE SD runs it): each rank of the ulysses
// group keeps a share of the image / video tokens through every block; around each attention an
// all-to-all trades the sequence split for a head split (every rank attends over all tokens with
// heads / U of the heads) and a second one trades it back.
//
// - The token shares are split_sizes(N, U) (the first N % U ranks one token more), so N need not
//   divide; the head count must divide by U.
// - Flux's text tokens stay whole on every rank: their q, k, v are narrowed to the rank's heads
//   (no transfer) and their attention output is all-gathered over the heads.
// - Cross-attention (Wan: video queries, text keys) needs no transfer: every rank has the text.
// - It must be the first attention stage, so the stages below see all tokens for the rank's heads.
#pragma once

#include <map>

#include "parallel/communicator.h"
#include "pipelines/stage.h"

namespace cubevec::pipelines {

class UlyssesStage : public Stage, public models::SequenceSplit {
 public:
  explicit UlyssesStage(parallel::Communicator group);

  std::string name() const override;
  bool uses_attention() const override { return group_.size() > 1; }
  Tensor attend(const models::StepInfo& step, const models::AttentionIdentity& id, const models::AttentionProjection& project,
                const Stream& stream, const AttendNext& next) override;
  models::SequenceSplit* sequence_split() override { return group_.size() > 1 ? this : nullptr; }

  void split(models::BlockState& state, models::RopeTable& rope, int64_t text_rows, const Stream& stream) override;
  void join(models::BlockState& state, const Stream& stream) override;

  std::string summary() const override;
  nlohmann::ordered_json report() const override;

 private:
  parallel::Communicator group_;
  std::vector<int64_t> token_sizes_;  // every rank's share of the tokens in this forward
  std::map<std::string, int64_t> head_dim_;  // per attention module, from its last projection
  int64_t all_to_all_calls_ = 0;
};

}  // namespace cubevec::pipelines
