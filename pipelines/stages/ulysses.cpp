#include "pipelines/stages/ulysses.h"

#include <numeric>

#include "ops/vector_ops.h"
#include "parallel/collectives.h"
#include "tensor/error.h"

namespace cubevec::pipelines {

namespace {

// Rows [offset, offset + count) of `table` after its first `text_rows` rows, with those rows first.
Tensor keep_rows(const Tensor& table, int64_t text_rows, int64_t offset, int64_t count, const Stream& stream) {
  const Tensor mine = table.narrow(0, text_rows + offset, count);
  if (text_rows == 0) return ops::contiguous(mine, stream);
  return ops::concat({table.narrow(0, 0, text_rows), mine}, 0, stream);
}

}  // namespace

UlyssesStage::UlyssesStage(parallel::Communicator group) : group_(std::move(group)) {}

std::string UlyssesStage::name() const { return "ulysses x" + std::to_string(group_.size()); }

void UlyssesStage::split(models::BlockState& state, models::RopeTable& rope, int64_t text_rows, const Stream& stream) {
  const int64_t tokens = state.hidden.size(1);
  token_sizes_ = parallel::split_sizes(tokens, group_.size());
  if (rope.cos.size(0) != text_rows + tokens)
    throw Error("ulysses: the RoPE table has " + std::to_string(rope.cos.size(0)) + " rows for " + std::to_string(text_rows) +
                " text and " + std::to_string(tokens) + " image tokens");
  int64_t offset = 0;
  for (int r = 0; r < group_.rank(); ++r) offset += token_sizes_[static_cast<std::size_t>(r)];
  const int64_t mine = token_sizes_[static_cast<std::size_t>(group_.rank())];
  if (mine == 0)
    throw Error("ulysses: " + std::to_string(tokens) + " tokens cannot be shared by " + std::to_string(group_.size()) +
                " ranks (each needs at least one)");
  state.hidden = ops::contiguous(state.hidden.narrow(1, offset, mine), stream);
  rope.cos = keep_rows(rope.cos, text_rows, offset, mine, stream);
  rope.sin = keep_rows(rope.sin, text_rows, offset, mine, stream);
}

void UlyssesStage::join(models::BlockState& state, const Stream& stream) {
  state.hidden = parallel::all_gather(state.hidden, 1, group_, stream, "ulysses.tokens", token_sizes_);
}

Tensor UlyssesStage::attend(const models::StepInfo& /*step*/, const models::AttentionIdentity& id,
                            const models::AttentionProjection& project, const Stream& stream, const AttendNext& next) {
  if (id.kind == models::AttentionKind::cross) return next(project);  // every rank holds the text keys
  if (token_sizes_.empty()) throw Error("ulysses: attention in " + id.module + " before the tokens were split");
  const int ranks = group_.size();
  const int64_t text = id.kind == models::AttentionKind::joint ? id.text_len : 0;
  const int64_t tokens = std::accumulate(token_sizes_.begin(), token_sizes_.end(), int64_t{0});
  const models::AttentionProjection by_heads = [&] {
    const models::AttentionQkv qkv = project();
    const int64_t heads = qkv.q.size(2);
    if (heads % ranks != 0)
      throw Error("ulysses: " + id.module + " has " + std::to_string(heads) + " heads, which " + std::to_string(ranks) +
                  " ranks cannot share evenly (the ulysses degree must divide the head count)");
    head_dim_[id.module] = qkv.q.size(3);
    const int64_t first_head = group_.rank() * (heads / ranks);
    const auto switch_one = [&](const Tensor& x, const char* which) {
      const Tensor image = x.narrow(1, text, x.size(1) - text);
      const Tensor all_tokens = parallel::all_to_all(image, 2, 1, group_, stream, id.module + "." + which, token_sizes_);
      ++all_to_all_calls_;
      if (text == 0) return all_tokens;
      return ops::concat({x.narrow(1, 0, text).narrow(2, first_head, heads / ranks), all_tokens}, 1, stream);
    };
    return models::AttentionQkv{switch_one(qkv.q, "q"), switch_one(qkv.k, "k"), switch_one(qkv.v, "v")};
  };
  const Tensor out = next(by_heads);  // [B, text + tokens, heads / ranks * head_dim]
  const auto dim = head_dim_.find(id.module);
  if (dim == head_dim_.end()) throw Error("ulysses: " + id.module + "'s attention output came without its projection");
  const int64_t batch = out.size(0), head_dim = dim->second, local_heads = out.size(2) / head_dim;
  const Tensor per_head = ops::contiguous(out, stream).view({batch, text + tokens, local_heads, head_dim});
  const std::vector<int64_t> heads_of(static_cast<std::size_t>(ranks), local_heads);
  Tensor mine = parallel::all_to_all(per_head.narrow(1, text, tokens), 1, 2, group_, stream, id.module + ".out", heads_of);
  ++all_to_all_calls_;
  if (text > 0) {
    const Tensor text_out = parallel::all_gather(per_head.narrow(1, 0, text), 2, group_, stream, id.module + ".text_out", heads_of);
    mine = ops::concat({text_out, mine}, 1, stream);
  }
  return mine.reshape({batch, mine.size(1), local_heads * ranks * head_dim});
}

std::string UlyssesStage::summary() const {
  return std::to_string(group_.size()) + " ranks share the tokens; " + std::to_string(all_to_all_calls_) + " all-to-alls";
}

nlohmann::ordered_json UlyssesStage::report() const {
  return {{"degree", group_.size()}, {"all_to_all_calls", all_to_all_calls_}};
}

}  // namespace cubevec::pipelines
