// Tiled flash attention on the Cube unit's threads: heads in groups whose packed K/V fit a budget;
// per group, K/V are packed in parallel, then the (head, q-block) tasks run in parallel, each
// walking its head's key blocks with the online softmax (flash_tiles.h).
#include <algorithm>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "ops/attention/flash_tiles.h"
#include "ops/gemm/cpu_caches.h"

namespace cubevec::ops::attn {

namespace {

// Packed K/V per group of heads: the CPU's last-level cache (as it reports it; ops/gemm/cpu_caches.h),
// at least 8 MiB so that small problems still keep every thread busy, at most 64 MiB.
int64_t pack_budget_floats() {
  static const int64_t budget = std::clamp<int64_t>(gemm::this_cpu_caches().l3, int64_t{8} << 20, int64_t{64} << 20) / 4;
  return budget;
}

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
  const auto& heads = batch.heads;
  std::size_t h0 = 0;
  while (h0 < heads.size()) {
    // [h0, h1): the group; offsets of each head's packed K and V in one scratch buffer.
    std::vector<int64_t> offsets{0};
    std::size_t h1 = h0;
    while (h1 < heads.size()) {
      const int64_t size = g.packed_k_floats(heads[h1].sk) + g.packed_v_floats(heads[h1].sk);
      if (h1 > h0 && offsets.back() + size > pack_budget_floats()) break;
      offsets.push_back(offsets.back() + size);
      ++h1;
    }
    Scratch packed(offsets.back());
    auto kv_of = [&](std::size_t h) {
      float* base = packed.data() + offsets[h - h0];
      return PackedKV{base, base + g.packed_k_floats(heads[h].sk)};
    };
    // (head, key block) and (head, q-block) index spaces of the group.
    std::vector<int64_t> kb_start{0}, qb_start{0};
    for (std::size_t h = h0; h < h1; ++h) {
      kb_start.push_back(kb_start.back() + FlashGeometry::key_blocks(heads[h].sk));
      qb_start.push_back(qb_start.back() + g.q_blocks(heads[h].sq));
    }
    auto head_of = [](const std::vector<int64_t>& start, int64_t i) {
      return static_cast<std::size_t>(std::upper_bound(start.begin(), start.end(), i) - start.begin() - 1);
    };
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, kb_start.back()), [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t i = r.begin(); i < r.end(); ++i) {
        const std::size_t local = head_of(kb_start, i);
        const int64_t kb = i - kb_start[local];
        pack_kv_blocks(g, heads[h0 + local], batch.dtype, kb, kb + 1, kv_of(h0 + local));
      }
    });
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, qb_start.back()), [&](const tbb::blocked_range<int64_t>& r) {
      QBlockState st(g);
      std::vector<float> s(static_cast<std::size_t>(g.kernels->mr * kBlockKeys));
      for (int64_t i = r.begin(); i < r.end(); ++i) {
        const std::size_t local = head_of(qb_start, i);
        const int64_t qb = i - qb_start[local];
        run_q_block(g, batch, heads[h0 + local], kv_of(h0 + local), qb * g.block_rows(), st, s.data());
      }
    });
    h0 = h1;
  }
}

double AttentionBatch::flops() const {
  double total = 0;
  for (const auto& h : heads) total += 4.0 * static_cast<double>(h.sq) * static_cast<double>(h.sk) * static_cast<double>(d);
  return total;
}

}  // namespace cubevec::ops::attn
