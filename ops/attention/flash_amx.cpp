// Flash attention on AMX tiles (or, on CPUs without AMX, AVX512-BF16 and AVX512-VNNI dot products
// on the same packed operands): the tiled flash attention of flash.cpp with its two matmuls as
// tile products and the same f32 online softmax, masks, causal prefixes, block sparsity and
// log-sum-exp (flash_tiles.h). Tiles are 32 query rows (a "panel", four to a q-block of 128 rows:
// MindIE SD's sparse block) against 128 keys. P is rounded to bf16 and P V is a bf16 tile product.
//   flash_bf16: Q K^T in bf16 (q, k, v rounded to bf16: exact for bf16 activations).
//   flash_int8: Q K^T in int8 (AMX-INT8 or VNNI, exact int32 sums), as SageAttention quantizes: K smoothed
//               by its mean over the head's keys (which shifts each row's scores by one constant,
//               leaving the softmax as it was, and takes K's shared offset out of its int8 range),
//               then symmetric int8 with one scale per 128-key block; Q with one scale per 32-row
//               panel. A row or key holding a non-finite value gets its scores in f32 (against the
//               smoothed K, so its row keeps the same shift), NaN or infinite where exact
//               attention's are.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <tbb/parallel_for.h>

#include "base/error.h"
#include "ops/attention/flash_amx_kernels.h"
#include "ops/attention/flash_tiles.h"
#include "ops/gemm/driver.h"
#include "ops/gemm/int8.h"
#include "tensor/half.h"

namespace cubevec::ops::attn {

namespace {

// The geometry flash_tiles.h's helpers need: 32-row panels, columns in panels of 32 (dp = dpad),
// the AVX-512 softmax with its exp at bf16 precision, writing P in bf16 for the P V product. No
// f32 matmul kernels: the tiles do those.
const TileKernels& amx_tile_kernels() {
  static const TileKernels kernels = [] {
    TileKernels k = tile_kernels(Isa::avx512);
    k.mr = kAmxRows;
    k.nr = 32;
    k.qk = nullptr;
    k.softmax = softmax_tile_avx512_bf16p;  // P in bf16 for its product
    k.pv_wide = 32, k.pv_narrow = 32;
    k.pv_wide_kernel = nullptr, k.pv_narrow_kernel = nullptr;
    return k;
  }();
  return kernels;
}

// Row `row` of a head operand as bf16 (or f32) into dst[0 .. d).
void load_row_bf16(const void* base, int64_t ld, int64_t row, int64_t d, DType dtype, uint16_t* dst) {
  if (dtype == DType::bf16) std::memcpy(dst, static_cast<const uint16_t*>(base) + row * ld, static_cast<std::size_t>(d) * 2);
  else convert_f32_to_bf16(static_cast<const float*>(base) + row * ld, dst, static_cast<std::size_t>(d));
}
void load_row_f32(const void* base, int64_t ld, int64_t row, int64_t d, DType dtype, float* dst) {
  if (dtype == DType::bf16) convert_bf16_to_f32(static_cast<const uint16_t*>(base) + row * ld, dst, static_cast<std::size_t>(d));
  else std::memcpy(dst, static_cast<const float*>(base) + row * ld, static_cast<std::size_t>(d) * 4);
}

int64_t block_elems(int64_t dpad) { return dpad * kBlockKeys; }
int64_t round_up_64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

// Key block kb's V for the P V tiles: 64 key pairs x dpad x 2 (VNNI pair order), zero past the
// head's keys and dimensions.
void pack_v_block(const HeadProblem& head, DType dtype, int64_t d, int64_t dpad, int64_t kb, uint16_t* v) {
  const int64_t key0 = kb * kBlockKeys, keys = std::min<int64_t>(kBlockKeys, head.sk - key0);
  if (dtype == DType::bf16) {
    pack_v_block_bf16_avx512(static_cast<const uint16_t*>(head.v) + key0 * head.v_ld, head.v_ld, static_cast<int>(keys), d, dpad, v);
    return;
  }
  std::fill(v, v + block_elems(dpad), uint16_t{0});
  std::vector<uint16_t> rows(static_cast<std::size_t>(2 * dpad), 0);
  uint16_t* const r0 = rows.data();
  uint16_t* const r1 = rows.data() + dpad;
  for (int64_t j = 0; j < keys; j += 2) {
    load_row_bf16(head.v, head.v_ld, key0 + j, d, dtype, r0);
    if (j + 1 < keys) load_row_bf16(head.v, head.v_ld, key0 + j + 1, d, dtype, r1);
    else std::fill(r1, r1 + dpad, uint16_t{0});
    uint16_t* pair = v + (j / 2) * dpad * 2;
    for (int64_t c = 0; c < d; ++c) pair[2 * c] = r0[c], pair[2 * c + 1] = r1[c];
  }
}

// Key block kb's K for the bf16 Q K^T tiles: dpad / 2 dimension pairs x 128 keys x 2.
void pack_k_block_bf16(const HeadProblem& head, DType dtype, int64_t d, int64_t dpad, int64_t kb, uint16_t* k) {
  const int64_t key0 = kb * kBlockKeys, keys = std::min<int64_t>(kBlockKeys, head.sk - key0);
  if (dtype == DType::bf16 && head.k_ld < (int64_t{1} << 26)) {
    pack_k_block_bf16_avx512(static_cast<const uint16_t*>(head.k) + key0 * head.k_ld, head.k_ld, static_cast<int>(keys), d, dpad, k);
    return;
  }
  std::fill(k, k + block_elems(dpad), uint16_t{0});
  std::vector<uint16_t> row(static_cast<std::size_t>(dpad), 0);
  for (int64_t j = 0; j < keys; ++j) {
    load_row_bf16(head.k, head.k_ld, key0 + j, d, dtype, row.data());
    for (int64_t pair = 0; pair < dpad / 2; ++pair)
      std::memcpy(k + (pair * kBlockKeys + j) * 2, row.data() + 2 * pair, 2 * sizeof(uint16_t));
  }
}

// The tile loop of one q-block once its Q is ready: per key block, per panel that sees it,
// `qk(panel, kb, s)` writes the panel's scores, then the shared softmax step and the bf16 P V.
using PvBlock = void (*)(const uint16_t*, int, int64_t, const uint16_t*, float*, const float*);
using QkBlockBf16 = void (*)(const uint16_t*, int64_t, const uint16_t*, float*);

template <class PanelQk>
void walk_key_blocks(const FlashGeometry& g, const AttentionBatch& batch, const HeadProblem& head, const uint16_t* v_blocks,
                     QBlockState& st, float* s, PvBlock pv, PanelQk&& qk) {
  alignas(64) uint16_t p_bf16[kAmxRows * kBlockKeys];  // P for the product, as the softmax step writes it
  for (int64_t kb = 0; kb < FlashGeometry::key_blocks(head.sk); ++kb) {
    const int keys = static_cast<int>(std::min<int64_t>(kBlockKeys, head.sk - kb * kBlockKeys));
    bool any = false;
    for (int p = 0; p < st.panels; ++p) {
      if (!panel_sees_block(g, head, st, p, kb)) continue;
      any = true;
      float* m = st.m.data() + p * kAmxRows;
      float* l = st.l.data() + p * kAmxRows;
      float* alpha = st.alpha.data() + p * kAmxRows;
      qk(p, kb, s);
      softmax_step(g, head, batch.scale, st.q0 + p * kAmxRows, kb, s, m, l, alpha, p_bf16);
      pv(p_bf16, keys, g.dp, v_blocks + kb * block_elems(g.dp), st.o.data() + p * kAmxRows * g.dp, st.o_started[p] ? alpha : nullptr);
      st.o_started[p] = true;
    }
    if (!any && later_blocks_unseen_too(head)) break;
  }
}

// ---- flash_bf16 ----

// One head's K and V for the bf16 tiles, each key_blocks x block_elems(dpad) bf16.
struct PackedKVBf16 {
  uint16_t* k = nullptr;
  uint16_t* v = nullptr;
};

// The two products of flash_bf16 on one kind of hardware.
struct Bf16Products {
  QkBlockBf16 qk;
  PvBlock pv;
};
Bf16Products bf16_products(Bf16Tiles tiles) {
  if (tiles == Bf16Tiles::avx512_bf16) return {dot_qk_block, dot_pv_block};
  return gemm::amx_model_on() ? Bf16Products{amx_model::amx_qk_block, amx_model::amx_pv_block} : Bf16Products{amx_qk_block, amx_pv_block};
}

void run_q_block_bf16(const FlashGeometry& g, const AttentionBatch& batch, const HeadProblem& head, const PackedKVBf16& kv, int64_t q0,
                      QBlockState& st, std::vector<uint16_t>& q, float* s, const Bf16Products& products) {
  reset_q_block(g, head, q0, st);  // the softmax state (the Q panels are packed below, in bf16)
  const int64_t dpad = g.dp;
  std::fill(q.begin(), q.end(), uint16_t{0});
  for (int64_t r = 0; r < std::min<int64_t>(g.block_rows(), head.sq - q0); ++r)
    load_row_bf16(head.q, head.q_ld, q0 + r, g.d, batch.dtype, q.data() + r * dpad);
  walk_key_blocks(g, batch, head, kv.v, st, s, products.pv, [&](int p, int64_t kb, float* scores) {
    products.qk(q.data() + p * kAmxRows * dpad, dpad, kv.k + kb * block_elems(dpad), scores);
  });
  finish_q_block(g, head, batch.dtype, st, st.m.data(), st.l.data());
}

// ---- flash_int8 ----

int64_t int8_dpad(int64_t d) { return (d + 63) / 64 * 64; }  // a tile step is 64 dimensions

// 127 / amax (0 for an all-zero operand, whose int8 values are then zero), at most the largest
// float: for a subnormal amax the quotient would be infinite, and 0 x inf is NaN.
float inverse_scale(float amax) {
  return amax > 0 ? static_cast<float>(std::min(127.0 / amax, static_cast<double>(std::numeric_limits<float>::max()))) : 0.0f;
}

// One head's int8 K (key_blocks x dpad8 x 128), its per-block scales, its per-key "non-finite"
// flags (key_blocks x 128), its per-key sums of the int8 values (key_blocks x 128, for the VNNI
// products' u8 shift) and its bf16 V (as flash_bf16's), in one allocation.
struct PackedKVInt8 {
  int8_t* k = nullptr;
  float* k_scale = nullptr;
  uint8_t* k_bad = nullptr;
  int32_t* k_sum = nullptr;
  uint16_t* v = nullptr;
};
struct Int8Layout {
  int64_t dpad8 = 0, dpad = 0;
  int64_t k_bytes(int64_t blocks) const { return blocks * dpad8 * kBlockKeys; }
  int64_t scale_bytes(int64_t blocks) const { return round_up_64(blocks * 4); }
  int64_t bad_bytes(int64_t blocks) const { return round_up_64(blocks * kBlockKeys); }
  int64_t sum_bytes(int64_t blocks) const { return blocks * kBlockKeys * 4; }
  int64_t total_bytes(int64_t blocks) const {
    return k_bytes(blocks) + scale_bytes(blocks) + bad_bytes(blocks) + sum_bytes(blocks) + blocks * block_elems(dpad) * 2;
  }
  PackedKVInt8 at(std::byte* base, int64_t blocks) const {
    PackedKVInt8 p;
    p.k = reinterpret_cast<int8_t*>(base);
    p.k_scale = reinterpret_cast<float*>(base + k_bytes(blocks));
    p.k_bad = reinterpret_cast<uint8_t*>(base + k_bytes(blocks) + scale_bytes(blocks));
    p.k_sum = reinterpret_cast<int32_t*>(base + k_bytes(blocks) + scale_bytes(blocks) + bad_bytes(blocks));
    p.v = reinterpret_cast<uint16_t*>(base + k_bytes(blocks) + scale_bytes(blocks) + bad_bytes(blocks) + sum_bytes(blocks));
    return p;
  }
};

// The mean of each of the head's K channels over its keys (keys holding a non-finite value left
// out); zero, so no smoothing, when K's values come within a factor 2 of the float range (k - mean
// could overflow).
std::vector<float> key_mean(const HeadProblem& head, DType dtype, int64_t d) {
  std::vector<double> sum(static_cast<std::size_t>(d), 0.0);
  std::vector<float> row(static_cast<std::size_t>(d));
  int64_t counted = 0;
  float amax = 0;
  for (int64_t j = 0; j < head.sk; ++j) {
    load_row_f32(head.k, head.k_ld, j, d, dtype, row.data());
    const float row_max = abs_max_avx512(row.data(), d);
    if (!std::isfinite(row_max)) continue;
    amax = std::max(amax, row_max);
    for (int64_t c = 0; c < d; ++c) sum[static_cast<std::size_t>(c)] += row[static_cast<std::size_t>(c)];
    ++counted;
  }
  std::vector<float> mean(static_cast<std::size_t>(d), 0.0f);
  if (counted > 0 && amax <= std::numeric_limits<float>::max() / 2)
    for (int64_t c = 0; c < d; ++c)
      mean[static_cast<std::size_t>(c)] = static_cast<float>(sum[static_cast<std::size_t>(c)] / static_cast<double>(counted));
  return mean;
}

// Key block kb's smoothed K in int8: one scale for the block (its largest |k - mean| / 127). A key
// holding a non-finite value is flagged instead: its scores are computed in f32 (below).
void pack_k_block_int8(const HeadProblem& head, DType dtype, int64_t d, const Int8Layout& lay, const float* mean, int64_t kb,
                       const PackedKVInt8& out) {
  int8_t* k = out.k + kb * lay.dpad8 * kBlockKeys;
  uint8_t* bad = out.k_bad + kb * kBlockKeys;
  int32_t* sums = out.k_sum + kb * kBlockKeys;
  std::fill(k, k + lay.dpad8 * kBlockKeys, int8_t{0});
  std::fill(bad, bad + kBlockKeys, uint8_t{0});
  std::fill(sums, sums + kBlockKeys, int32_t{0});
  const int64_t key0 = kb * kBlockKeys, keys = std::min<int64_t>(kBlockKeys, head.sk - key0);
  std::vector<float> rows(static_cast<std::size_t>(keys * d));
  float amax = 0;
  for (int64_t j = 0; j < keys; ++j) {
    float* r = rows.data() + j * d;
    load_row_f32(head.k, head.k_ld, key0 + j, d, dtype, r);
    for (int64_t c = 0; c < d; ++c) r[c] -= mean[c];
    const float row_max = abs_max_avx512(r, d);
    if (std::isfinite(row_max)) amax = std::max(amax, row_max);
    else bad[j] = 1;
  }
  out.k_scale[kb] = amax / 127.0f;
  const float inv = inverse_scale(amax);
  std::vector<int8_t> row(static_cast<std::size_t>(lay.dpad8), 0);
  for (int64_t j = 0; j < keys; ++j) {
    if (bad[j]) continue;
    quantize_int8_avx512(rows.data() + j * d, d, inv, row.data());
    for (int64_t quad = 0; quad < lay.dpad8 / 4; ++quad) std::memcpy(k + (quad * kBlockKeys + j) * 4, row.data() + 4 * quad, 4);
    int32_t sum = 0;
    for (int64_t c = 0; c < d; ++c) sum += row[static_cast<std::size_t>(c)];
    sums[j] = sum;
  }
}

// A q-block's Q: in int8, one scale per 32-row panel, and as f32 (the rows holding a non-finite
// value get their scores in f32 against the smoothed K, as exact attention would); `key` holds the
// f32 key row such a score needs (a thread's scratch, kept across q-blocks).
struct QBlockInt8 {
  QBlockInt8(const FlashGeometry& g, int64_t dpad8)
      : q(static_cast<std::size_t>(g.block_rows() * dpad8)),
        q_shifted(q.size()),
        f32(static_cast<std::size_t>(g.block_rows() * g.d)),
        key(static_cast<std::size_t>(g.d)) {}
  std::vector<int8_t> q;
  std::vector<uint8_t> q_shifted;  // q + 128, for the VNNI products (filled only for them)
  std::vector<float> f32, key;
  float scale[kPanelsPerBlock * kAmxRows] = {};
  bool bad[kPanelsPerBlock * kAmxRows] = {};
  bool panel_bad[kPanelsPerBlock] = {};
};

void quantize_q_block(const FlashGeometry& g, const AttentionBatch& batch, const HeadProblem& head, int64_t dpad8, int64_t q0,
                      QBlockInt8& out) {
  std::fill(out.q.begin(), out.q.end(), int8_t{0});
  for (int p = 0; p < kPanelsPerBlock; ++p) {
    const int64_t r0 = q0 + p * kAmxRows, n = std::clamp<int64_t>(head.sq - r0, 0, kAmxRows);
    float amax = 0;
    out.panel_bad[p] = false;
    for (int64_t r = 0; r < kAmxRows; ++r) {
      const int64_t i = p * kAmxRows + r;
      out.bad[i] = false;
      if (r >= n) continue;
      float* row = out.f32.data() + i * g.d;
      load_row_f32(head.q, head.q_ld, r0 + r, g.d, batch.dtype, row);
      const float row_max = abs_max_avx512(row, g.d);
      if (std::isfinite(row_max)) amax = std::max(amax, row_max);
      else out.bad[i] = out.panel_bad[p] = true;
    }
    const float inv = inverse_scale(amax);
    for (int64_t r = 0; r < kAmxRows; ++r) {
      const int64_t i = p * kAmxRows + r;
      out.scale[i] = amax / 127.0f;
      if (r < n && !out.bad[i]) quantize_int8_avx512(out.f32.data() + i * g.d, g.d, inv, out.q.data() + i * dpad8);
    }
  }
}

// q . (k - mean) in f32, for a score the int8 product cannot give (a non-finite q or k).
float smoothed_dot(const float* q, const float* k, const float* mean, int64_t d) {
  float sum = 0;
  for (int64_t c = 0; c < d; ++c) sum += q[c] * (k[c] - mean[c]);
  return sum;
}

void run_q_block_int8(const FlashGeometry& g, const AttentionBatch& batch, const HeadProblem& head, const Int8Layout& lay,
                      const PackedKVInt8& kv, const float* mean, int64_t q0, QBlockState& st, QBlockInt8& qb, float* s, Int8Tiles tiles) {
  reset_q_block(g, head, q0, st);
  quantize_q_block(g, batch, head, lay.dpad8, q0, qb);
  const bool vnni = tiles == Int8Tiles::avx512_vnni;
  if (vnni)
    for (std::size_t i = 0; i < qb.q.size(); ++i) qb.q_shifted[i] = static_cast<uint8_t>(qb.q[i] + 128);
  const bool model = gemm::amx_model_on();
  const PvBlock pv = vnni ? dot_pv_block : model ? amx_model::amx_pv_block : amx_pv_block;
  const auto qk_tiles = model ? amx_model::amx_qk_block_int8 : amx_qk_block_int8;
  walk_key_blocks(g, batch, head, kv.v, st, s, pv, [&](int p, int64_t kb, float* scores) {
    const int64_t panel = p * kAmxRows * lay.dpad8;
    const int8_t* k_block = kv.k + kb * lay.dpad8 * kBlockKeys;
    if (vnni)
      dot_qk_block_int8(qb.q_shifted.data() + panel, lay.dpad8, k_block, kv.k_sum + kb * kBlockKeys, qb.scale + p * kAmxRows,
                        kv.k_scale[kb], scores);
    else qk_tiles(qb.q.data() + panel, lay.dpad8, k_block, qb.scale + p * kAmxRows, kv.k_scale[kb], scores);
    const uint8_t* bad = kv.k_bad + kb * kBlockKeys;
    if (!qb.panel_bad[p] && std::memchr(bad, 1, kBlockKeys) == nullptr) return;  // the usual case: all finite
    const int64_t key0 = kb * kBlockKeys, keys = std::min<int64_t>(kBlockKeys, head.sk - key0);
    const int64_t rows = std::clamp<int64_t>(head.sq - (q0 + p * kAmxRows), 0, kAmxRows);
    for (int64_t j = 0; j < keys; ++j) {
      bool loaded = false;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = p * kAmxRows + r;
        if (!bad[j] && !qb.bad[i]) continue;
        if (!loaded) load_row_f32(head.k, head.k_ld, key0 + j, g.d, batch.dtype, qb.key.data()), loaded = true;
        scores[r * kBlockKeys + j] = smoothed_dot(qb.f32.data() + i * g.d, qb.key.data(), mean, g.d);
      }
    }
  });
  finish_q_block(g, head, batch.dtype, st, st.m.data(), st.l.data());
}

}  // namespace

// Both kinds also need AVX512-BF16 for the softmax step, which writes P in bf16 (every AMX CPU so far has it).
bool bf16_tiles_available(Bf16Tiles tiles) { return gemm::has_bf16_dot() && (tiles == Bf16Tiles::avx512_bf16 || gemm::amx_ready()); }
bool flash_amx_available() { return bf16_tiles_available(Bf16Tiles::amx) || bf16_tiles_available(Bf16Tiles::avx512_bf16); }
bool int8_tiles_available(Int8Tiles tiles) {
  return gemm::has_bf16_dot() && (tiles == Int8Tiles::amx ? gemm::amx_ready() && gemm::int8_isa_supported(gemm::Int8Isa::amx)
                                                          : gemm::int8_isa_supported(gemm::Int8Isa::avx512_vnni));
}
bool flash_int8_available() { return int8_tiles_available(Int8Tiles::amx) || int8_tiles_available(Int8Tiles::avx512_vnni); }

void run_flash_amx(const AttentionBatch& batch) {
  if (!flash_amx_available())
    throw Error("attention: flash_bf16 needs AMX-BF16 or AVX512-BF16, which this CPU (or its kernel) does not offer");
  run_flash_amx(batch, bf16_tiles_available(Bf16Tiles::amx) ? Bf16Tiles::amx : Bf16Tiles::avx512_bf16);
}

void run_flash_amx(const AttentionBatch& batch, Bf16Tiles tiles) {
  if (!bf16_tiles_available(tiles))
    throw Error(std::string("attention: flash_bf16's ") + (tiles == Bf16Tiles::amx ? "AMX-BF16" : "AVX512-BF16") +
                " products are not available on this CPU");
  const Bf16Products products = bf16_products(tiles);
  const FlashGeometry g(amx_tile_kernels(), batch.d);
  const int64_t dpad = g.dp;
  const auto kv_of = [&](const PackedHeadItem& item) {
    uint16_t* base = reinterpret_cast<uint16_t*>(item.packed);
    return PackedKVBf16{base, base + FlashGeometry::key_blocks(batch.heads[item.head].sk) * block_elems(dpad)};
  };
  walk_head_groups(
      batch.heads, [&](const HeadProblem& h) { return 2 * FlashGeometry::key_blocks(h.sk) * block_elems(dpad) * int64_t{2}; }, g,
      [&](const PackedHeadItem& item) {
        const HeadProblem& head = batch.heads[item.head];
        const PackedKVBf16 kv = kv_of(item);
        pack_k_block_bf16(head, batch.dtype, batch.d, dpad, item.index, kv.k + item.index * block_elems(dpad));
        pack_v_block(head, batch.dtype, batch.d, dpad, item.index, kv.v + item.index * block_elems(dpad));
      },
      [&](int64_t begin, int64_t end, const HeadItemOf& item_at) {
        QBlockState st(g);
        std::vector<uint16_t> q(static_cast<std::size_t>(g.block_rows() * dpad));
        Scratch s(int64_t{kAmxRows} * kBlockKeys);
        for (int64_t i = begin; i < end; ++i) {
          const PackedHeadItem item = item_at(i);
          run_q_block_bf16(g, batch, batch.heads[item.head], kv_of(item), item.index * g.block_rows(), st, q, s.data(), products);
        }
      });
}

void run_flash_int8(const AttentionBatch& batch) {
  if (!flash_int8_available())
    throw Error("attention: flash_int8 needs AMX-INT8 (or AVX512-VNNI with AVX512-BF16), which this CPU (or its kernel) does not offer");
  run_flash_int8(batch, int8_tiles_available(Int8Tiles::amx) ? Int8Tiles::amx : Int8Tiles::avx512_vnni);
}

void run_flash_int8(const AttentionBatch& batch, Int8Tiles tiles) {
  if (!int8_tiles_available(tiles))
    throw Error(std::string("attention: flash_int8's ") + (tiles == Int8Tiles::amx ? "AMX-INT8" : "AVX512-VNNI and AVX512-BF16") +
                " products are not available on this CPU");
  const FlashGeometry g(amx_tile_kernels(), batch.d);
  const Int8Layout lay{int8_dpad(batch.d), g.dp};
  // K's channel means first: every block of a head is smoothed by the same one.
  std::vector<std::vector<float>> means(batch.heads.size());
  tbb::parallel_for(std::size_t{0}, batch.heads.size(), [&](std::size_t h) { means[h] = key_mean(batch.heads[h], batch.dtype, batch.d); });
  const auto kv_of = [&](const PackedHeadItem& item) { return lay.at(item.packed, FlashGeometry::key_blocks(batch.heads[item.head].sk)); };
  walk_head_groups(
      batch.heads, [&](const HeadProblem& h) { return lay.total_bytes(FlashGeometry::key_blocks(h.sk)); }, g,
      [&](const PackedHeadItem& item) {
        const HeadProblem& head = batch.heads[item.head];
        const PackedKVInt8 kv = kv_of(item);
        pack_k_block_int8(head, batch.dtype, batch.d, lay, means[item.head].data(), item.index, kv);
        pack_v_block(head, batch.dtype, batch.d, lay.dpad, item.index, kv.v + item.index * block_elems(lay.dpad));
      },
      [&](int64_t begin, int64_t end, const HeadItemOf& item_at) {
        QBlockState st(g);
        QBlockInt8 qb(g, lay.dpad8);
        Scratch s(int64_t{kAmxRows} * kBlockKeys);
        for (int64_t i = begin; i < end; ++i) {
          const PackedHeadItem item = item_at(i);
          run_q_block_int8(g, batch, batch.heads[item.head], lay, kv_of(item), means[item.head].data(), item.index * g.block_rows(), st, qb,
                           s.data(), tiles);
        }
      });
}

}  // namespace cubevec::ops::attn
