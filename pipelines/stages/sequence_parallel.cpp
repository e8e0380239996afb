#include "pipelines/stages/sequence_parallel.h"

#include <numeric>

#include "ops/attention.h"
#include "ops/vector_ops.h"
#include "parallel/collectives.h"
#include "base/error.h"

namespace cubevec::pipelines {

namespace {

// Rows [offset, offset + count) of `table` after its first `text_rows` rows, with those rows first.
Tensor keep_rows(const Tensor& table, int64_t text_rows, int64_t offset, int64_t count, const Stream& stream) {
  const Tensor mine = table.narrow(0, text_rows + offset, count);
  if (text_rows == 0) return ops::contiguous(mine, stream);
  return ops::concat({table.narrow(0, 0, text_rows), mine}, 0, stream);
}

int64_t sum(const std::vector<int64_t>& sizes) { return std::accumulate(sizes.begin(), sizes.end(), int64_t{0}); }

}  // namespace

SequenceParallelStage::SequenceParallelStage(parallel::Communicator ulysses, parallel::Communicator ring)
    : ulysses_(std::move(ulysses)), ring_(std::move(ring)) {}

std::string SequenceParallelStage::name() const {
  std::string text;
  if (ulysses_.size() > 1) text = "ulysses x" + std::to_string(ulysses_.size());
  if (ring_.size() > 1) text += (text.empty() ? "" : " ") + std::string("ring x") + std::to_string(ring_.size());
  return text.empty() ? "sequence parallel x1" : text;
}

void SequenceParallelStage::split(models::BlockState& state, models::RopeTable& rope, int64_t text_rows, const Stream& stream) {
  const int64_t tokens = state.hidden.size(1);
  const int u = ulysses_.size(), r = ring_.size();
  const std::vector<int64_t> shares = parallel::split_sizes(tokens, u * r);
  if (rope.cos.size(0) != text_rows + tokens)
    throw Error(name() + ": the RoPE table has " + std::to_string(rope.cos.size(0)) + " rows for " + std::to_string(text_rows) +
                " text and " + std::to_string(tokens) + " image tokens");
  const auto share = [&](int ring_index, int ulysses_index) { return shares[static_cast<std::size_t>(ring_index * u + ulysses_index)]; };
  token_sizes_.assign(static_cast<std::size_t>(u), 0);
  for (int i = 0; i < u; ++i) token_sizes_[static_cast<std::size_t>(i)] = share(ring_.rank(), i);
  ring_sizes_.assign(static_cast<std::size_t>(r), 0);
  for (int j = 0; j < r; ++j)
    for (int i = 0; i < u; ++i) ring_sizes_[static_cast<std::size_t>(j)] += share(j, i);
  const int64_t index = ring_.rank() * u + ulysses_.rank();
  const int64_t offset = std::accumulate(shares.begin(), shares.begin() + index, int64_t{0});
  const int64_t mine = shares[static_cast<std::size_t>(index)];
  // Checked for every rank's share, so all ranks (and simulate mode, which sees only rank 0) refuse alike.
  if (tokens < static_cast<int64_t>(u) * r)
    throw Error(name() + ": " + std::to_string(tokens) + " tokens cannot be shared by " + std::to_string(u * r) +
                " ranks (each needs at least one)");
  state.hidden = ops::contiguous(state.hidden.narrow(1, offset, mine), stream);
  token_offset_ = offset, token_count_ = mine, split_tokens_ = tokens;
  rope.cos = keep_rows(rope.cos, text_rows, offset, mine, stream);
  rope.sin = keep_rows(rope.sin, text_rows, offset, mine, stream);
}

Tensor SequenceParallelStage::keep_tokens(const Tensor& per_token, const Stream& stream) const {
  if (per_token.dim() < 2 || per_token.size(1) != split_tokens_)
    throw Error(name() + ": a per-token tensor " + shape_to_string(per_token.shape()) + " does not hold the " +
                std::to_string(split_tokens_) + " tokens the hidden state was split from");
  return ops::contiguous(per_token.narrow(1, token_offset_, token_count_), stream);
}

void SequenceParallelStage::join(models::BlockState& state, const Stream& stream) {
  if (ulysses_.size() > 1) state.hidden = parallel::all_gather(state.hidden, 1, ulysses_, stream, "ulysses.tokens", token_sizes_);
  if (ring_.size() > 1) state.hidden = parallel::all_gather(state.hidden, 1, ring_, stream, "ring.tokens", ring_sizes_);
}

Tensor SequenceParallelStage::attend(const models::StepInfo& /*step*/, const models::AttentionIdentity& id,
                                     const models::AttentionProjection& project, const Stream& stream, const AttendNext& next) {
  if (id.kind == models::AttentionKind::cross) return next(project);  // every rank holds the text keys
  if (token_sizes_.empty()) throw Error(name() + ": attention in " + id.module + " before the tokens were split");
  const int ranks = ulysses_.size();
  const int64_t text = id.kind == models::AttentionKind::joint ? id.text_len : 0;
  const int64_t tokens = sum(token_sizes_);
  const models::AttentionProjection by_heads = [&] {
    const models::AttentionQkv qkv = project();
    if (ranks == 1) return qkv;
    const int64_t heads = qkv.q.size(2);
    if (heads % ranks != 0)
      throw Error("ulysses: " + id.module + " has " + std::to_string(heads) + " heads, which " + std::to_string(ranks) +
                  " ranks cannot share evenly (the ulysses degree must divide the head count)");
    head_dim_[id.module] = qkv.q.size(3);
    const int64_t first_head = ulysses_.rank() * (heads / ranks);
    const auto switch_one = [&](const Tensor& x, const char* which) {
      const Tensor image = x.narrow(1, text, x.size(1) - text);
      const Tensor all_tokens = parallel::all_to_all(image, 2, 1, ulysses_, stream, id.module + "." + which, token_sizes_);
      ++all_to_all_calls_;
      if (text == 0) return all_tokens;
      return ops::concat({x.narrow(1, 0, text).narrow(2, first_head, heads / ranks), all_tokens}, 1, stream);
    };
    return models::AttentionQkv{switch_one(qkv.q, "q"), switch_one(qkv.k, "k"), switch_one(qkv.v, "v")};
  };
  // [B, text + tokens, heads / ranks * head_dim]
  const Tensor out = ring_.size() > 1 ? ring_attention(id, by_heads(), text, stream) : next(by_heads);
  if (ranks == 1) return out;
  const auto dim = head_dim_.find(id.module);
  if (dim == head_dim_.end()) throw Error("ulysses: " + id.module + "'s attention output came without its projection");
  const int64_t batch = out.size(0), head_dim = dim->second, local_heads = out.size(2) / head_dim;
  const Tensor per_head = ops::contiguous(out, stream).view({batch, text + tokens, local_heads, head_dim});
  const std::vector<int64_t> heads_of(static_cast<std::size_t>(ranks), local_heads);
  Tensor mine = parallel::all_to_all(per_head.narrow(1, text, tokens), 1, 2, ulysses_, stream, id.module + ".out", heads_of);
  ++all_to_all_calls_;
  if (text > 0) {
    const Tensor text_out = parallel::all_gather(per_head.narrow(1, 0, text), 2, ulysses_, stream, id.module + ".text_out", heads_of);
    mine = ops::concat({text_out, mine}, 1, stream);
  }
  return mine.reshape({batch, mine.size(1), local_heads * ranks * head_dim});
}

Tensor SequenceParallelStage::ring_attention(const models::AttentionIdentity& id, const models::AttentionQkv& qkv, int64_t text,
                                             const Stream& stream) {
  const int members = ring_.size(), me = ring_.rank();
  const int next_member = (me + 1) % members, previous_member = (me + members - 1) % members;
  // What travels: this member's image K/V (the text keys, held by every member, are attended once, locally).
  Tensor k = ops::contiguous(qkv.k.narrow(1, text, qkv.k.size(1) - text), stream);
  Tensor v = ops::contiguous(qkv.v.narrow(1, text, qkv.v.size(1) - text), stream);
  Stream transfers = stream.device().named_stream("ring.kv");
  // Step s brings the span of member (me - s): started on the comm unit before step s - 1 is attended.
  const auto start_transfer = [&](int step) {
    Shape shape = k.shape();
    shape[1] = ring_sizes_[static_cast<std::size_t>((me - step + members) % members)];
    transfers.wait(stream.record());
    k = parallel::send_recv(k, next_member, previous_member, shape, ring_, transfers, id.module + ".ring.k");
    v = parallel::send_recv(v, next_member, previous_member, shape, ring_, transfers, id.module + ".ring.v");
    ring_transfers_ += 2;
    return transfers.record();
  };
  Event arrived = start_transfer(1);
  ops::AttentionPartial acc = ops::attention_forward_with_lse(qkv.q, qkv.k, qkv.v, {}, stream);
  for (int step = 1; step < members; ++step) {
    stream.wait(arrived);
    const Tensor k_step = k, v_step = v;
    if (step + 1 < members) arrived = start_transfer(step + 1);
    acc = ops::merge_attention_partials(acc, ops::attention_forward_with_lse(qkv.q, k_step, v_step, {}, stream), ops::AttentionLayout::bsnd,
                                        stream);
  }
  const Tensor& out = acc.out;  // [B, S, heads, head_dim]
  return out.reshape({out.size(0), out.size(1), out.size(2) * out.size(3)});
}

std::string SequenceParallelStage::summary() const {
  std::string text = std::to_string(ranks()) + " ranks share the tokens";
  if (ulysses_.size() > 1) text += "; " + std::to_string(all_to_all_calls_) + " all-to-alls";
  if (ring_.size() > 1) text += "; " + std::to_string(ring_transfers_) + " ring transfers";
  return text;
}

nlohmann::ordered_json SequenceParallelStage::report() const {
  return {
      {"ulysses", ulysses_.size()}, {"ring", ring_.size()}, {"all_to_all_calls", all_to_all_calls_}, {"ring_transfers", ring_transfers_}};
}

}  // namespace cubevec::pipelines
