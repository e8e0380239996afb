// bf16 flash attention on AMX-BF16 tiles: the tiled flash attention of flash.cpp with its two
// matmuls (Q K^T and P V) as bf16 tile products summed in f32, and the same f32 online softmax,
// masks, causal prefixes, block sparsity and log-sum-exp (flash_tiles.h). Tiles are 32 query rows
// (a "panel", four to a q-block of 128 rows: MindIE SD's sparse block) against 128 keys.
// q, k and v are rounded to bf16 (exact for bf16 activations); P is rounded to bf16 before P V.
#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "ops/attention/flash_amx_kernels.h"
#include "ops/attention/flash_tiles.h"
#include "ops/gemm/driver.h"
#include "tensor/half.h"

namespace cubevec::ops::attn {

namespace {

// The geometry flash_tiles.h's helpers need: 32-row panels, columns in panels of 32 (dp = dpad),
// the AVX-512 softmax. No f32 matmul kernels: the tiles do those.
const TileKernels& amx_tile_kernels() {
  static const TileKernels kernels = [] {
    TileKernels k = tile_kernels(Isa::avx512);
    k.mr = kAmxRows;
    k.nr = 32;
    k.qk = nullptr;
    k.pv_wide = 32, k.pv_narrow = 32;
    k.pv_wide_kernel = nullptr, k.pv_narrow_kernel = nullptr;
    return k;
  }();
  return kernels;
}

// Row `row` of a head operand as bf16 into dst[0 .. d).
void load_row_bf16(const void* base, int64_t ld, int64_t row, int64_t d, DType dtype, uint16_t* dst) {
  if (dtype == DType::bf16) std::memcpy(dst, static_cast<const uint16_t*>(base) + row * ld, static_cast<std::size_t>(d) * 2);
  else convert_f32_to_bf16(static_cast<const float*>(base) + row * ld, dst, static_cast<std::size_t>(d));
}

// One head's K and V for the tiles: per key block, K as dpad / 2 dimension pairs x 128 keys x 2 and
// V as 64 key pairs x dpad x 2 (VNNI pair order), zero past the head's keys and dimensions.
struct PackedKVBf16 {
  uint16_t* k = nullptr;
  uint16_t* v = nullptr;
};
int64_t block_elems(int64_t dpad) { return dpad * kBlockKeys; }

void pack_kv_block(const HeadProblem& head, DType dtype, int64_t d, int64_t dpad, int64_t kb, const PackedKVBf16& out) {
  uint16_t* k = out.k + kb * block_elems(dpad);
  uint16_t* v = out.v + kb * block_elems(dpad);
  std::fill(k, k + block_elems(dpad), uint16_t{0});
  std::fill(v, v + block_elems(dpad), uint16_t{0});
  const int64_t key0 = kb * kBlockKeys, keys = std::min<int64_t>(kBlockKeys, head.sk - key0);
  // Rows in bf16, padded with zeros to dpad: a pair of dimensions (K) or of keys (V) is one 32-bit word.
  std::vector<uint16_t> rows(static_cast<std::size_t>(2 * dpad), 0);
  uint16_t* const r0 = rows.data();
  uint16_t* const r1 = rows.data() + dpad;
  for (int64_t j = 0; j < keys; ++j) {
    load_row_bf16(head.k, head.k_ld, key0 + j, d, dtype, r0);
    for (int64_t pair = 0; pair < dpad / 2; ++pair) std::memcpy(k + (pair * kBlockKeys + j) * 2, r0 + 2 * pair, 2 * sizeof(uint16_t));
  }
  for (int64_t j = 0; j < keys; j += 2) {
    load_row_bf16(head.v, head.v_ld, key0 + j, d, dtype, r0);
    if (j + 1 < keys) load_row_bf16(head.v, head.v_ld, key0 + j + 1, d, dtype, r1);
    else std::fill(r1, r1 + dpad, uint16_t{0});
    uint16_t* pair = v + (j / 2) * dpad * 2;
    for (int64_t c = 0; c < d; ++c) pair[2 * c] = r0[c], pair[2 * c + 1] = r1[c];
  }
}

void run_q_block(const FlashGeometry& g, const AttentionBatch& batch, const HeadProblem& head, const PackedKVBf16& kv, int64_t q0,
                 QBlockState& st, std::vector<uint16_t>& q, float* s) {
  reset_q_block(g, head, q0, st);  // the softmax state (the Q panels are packed below, in bf16)
  const int64_t d = g.d, dpad = g.dp;
  std::fill(q.begin(), q.end(), uint16_t{0});
  for (int64_t r = 0; r < std::min<int64_t>(g.block_rows(), head.sq - q0); ++r)
    load_row_bf16(head.q, head.q_ld, q0 + r, d, batch.dtype, q.data() + r * dpad);
  for (int64_t kb = 0; kb < FlashGeometry::key_blocks(head.sk); ++kb) {
    const int keys = static_cast<int>(std::min<int64_t>(kBlockKeys, head.sk - kb * kBlockKeys));
    bool any = false;
    for (int p = 0; p < st.panels; ++p) {
      if (!panel_sees_block(g, head, st, p, kb)) continue;
      any = true;
      float* m = st.m.data() + p * kAmxRows;
      float* l = st.l.data() + p * kAmxRows;
      float* alpha = st.alpha.data() + p * kAmxRows;
      amx_qk_block(q.data() + p * kAmxRows * dpad, dpad, kv.k + kb * block_elems(dpad), s);
      softmax_step(g, head, batch.scale, q0 + p * kAmxRows, kb, s, m, l, alpha);
      amx_pv_block(s, keys, dpad, kv.v + kb * block_elems(dpad), st.o.data() + p * kAmxRows * dpad, st.o_started[p] ? alpha : nullptr);
      st.o_started[p] = true;
    }
    if (!any && later_blocks_unseen_too(head)) break;
  }
  finish_q_block(g, head, batch.dtype, st, st.m.data(), st.l.data());
}

}  // namespace

bool flash_amx_available() { return gemm::amx_ready(); }

void run_flash_amx(const AttentionBatch& batch) {
  if (!flash_amx_available()) throw Error("attention: flash_bf16 needs AMX-BF16, which this CPU (or its kernel) does not offer");
  const FlashGeometry g(amx_tile_kernels(), batch.d);
  const int64_t dpad = g.dp;
  const auto kv_of = [&](const PackedHeadItem& item) {
    uint16_t* base = reinterpret_cast<uint16_t*>(item.packed);
    return PackedKVBf16{base, base + FlashGeometry::key_blocks(batch.heads[item.head].sk) * block_elems(dpad)};
  };
  walk_head_groups(
      batch.heads, [&](const HeadProblem& h) { return 2 * FlashGeometry::key_blocks(h.sk) * block_elems(dpad) * int64_t{2}; }, g,
      [&](const PackedHeadItem& item) { pack_kv_block(batch.heads[item.head], batch.dtype, batch.d, dpad, item.index, kv_of(item)); },
      [&](int64_t begin, int64_t end, const HeadItemOf& item_at) {
        QBlockState st(g);
        std::vector<uint16_t> q(static_cast<std::size_t>(g.block_rows() * dpad));
        Scratch s(int64_t{kAmxRows} * kBlockKeys);
        for (int64_t i = begin; i < end; ++i) {
          const PackedHeadItem item = item_at(i);
          run_q_block(g, batch, batch.heads[item.head], kv_of(item), item.index * g.block_rows(), st, q, s.data());
        }
      });
}

}  // namespace cubevec::ops::attn
