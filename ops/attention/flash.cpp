// Tiled flash attention on the Cube unit's threads: heads in groups whose packed K/V fit a budget;
// per group, K/V are packed in parallel, then the (head, q-block) tasks run in parallel, each
// walking its head's key blocks with the online softmax (flash_tiles.h, walk_head_groups).
#include "ops/attention/flash_tiles.h"

namespace cubevec::ops::attn {

namespace {

void run_q_block(const FlashGeometry& g, const AttentionBatch& batch, const HeadProblem& head, const PackedKV& kv, int64_t q0,
                 QBlockState& st, float* s) {
  begin_q_block(g, head, batch.dtype, q0, st);
  const int64_t mr = g.kernels->mr;
  for (int64_t kb = 0; kb < FlashGeometry::key_blocks(head.sk); ++kb) {
    bool any = false;
    for (int p = 0; p < st.panels; ++p) {
      if (!panel_sees_block(g, head, st, p, kb)) continue;
      any = true;
      float* m = st.m.data() + p * mr;
      float* l = st.l.data() + p * mr;
      float* alpha = st.alpha.data() + p * mr;
      qk_tile(g, head, kv, st, p, kb, s);
      softmax_step(g, head, batch.scale, q0 + p * mr, kb, s, m, l, alpha);
      pv_tile(g, head, kv, st, p, kb, s, alpha);
    }
    if (!any && later_blocks_unseen_too(head)) break;
  }
  finish_q_block(g, head, batch.dtype, st, st.m.data(), st.l.data());
}

}  // namespace

void run_flash(const AttentionBatch& batch, const TileKernels* kernels) {
  const FlashGeometry g(kernels ? *kernels : tile_kernels(), batch.d);
  const auto kv_of = [&](const PackedHeadItem& item) {
    float* base = reinterpret_cast<float*>(item.packed);
    return PackedKV{base, base + g.packed_k_floats(batch.heads[item.head].sk)};
  };
  walk_head_groups(
      batch.heads, [&](const HeadProblem& h) { return (g.packed_k_floats(h.sk) + g.packed_v_floats(h.sk)) * int64_t{4}; }, g,
      [&](const PackedHeadItem& item) { pack_kv_blocks(g, batch.heads[item.head], batch.dtype, item.index, item.index + 1, kv_of(item)); },
      [&](int64_t begin, int64_t end, const HeadItemOf& item_at) {
        QBlockState st(g);
        std::vector<float> s(static_cast<std::size_t>(g.kernels->mr * kBlockKeys));
        for (int64_t i = begin; i < end; ++i) {
          const PackedHeadItem item = item_at(i);
          run_q_block(g, batch, batch.heads[item.head], kv_of(item), item.index * g.block_rows(), st, s.data());
        }
      });
}

double AttentionBatch::flops() const {
  double total = 0;
  for (const auto& h : heads) total += 4.0 * static_cast<double>(h.sq) * static_cast<double>(h.sk) * static_cast<double>(d);
  return total;
}

}  // namespace cubevec::ops::attn
