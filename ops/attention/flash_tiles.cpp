#include "ops/attention/flash_tiles.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "ops/gemm/cpu_caches.h"
#include "ops/gemm/driver.h"
#include "tensor/caching_allocator.h"
#include "base/error.h"
#include "tensor/half.h"

namespace cubevec::ops::attn {

static_assert(kBlockKeys == kSparseBlock, "block sparsity walks the tiles' key blocks");

namespace {

TileKernels make_kernels(Isa isa) {
  switch (isa) {
    case Isa::avx512:
      return {gemm::kMrAvx512, gemm::kNrAvx512, gemm::microkernel_avx512, 32, 16, pv_avx512_w32, pv_avx512_w16, softmax_tile_avx512};
    case Isa::avx2: return {gemm::kMrAvx2, gemm::kNrAvx2, gemm::microkernel_avx2, 16, 8, pv_avx2_w16, pv_avx2_w8, softmax_tile_avx2};
    case Isa::portable:
      return {gemm::kMrPortable, gemm::kNrPortable, gemm::microkernel_portable, 16, 8,
              pv_portable_w16,   pv_portable_w8,    softmax_tile_portable};
  }
  throw Error("attention: invalid ISA");
}

// Row `row` of a head operand as f32 into dst[0 .. d).
void load_row(const void* base, int64_t ld, int64_t row, int64_t d, DType dtype, float* dst) {
  if (dtype == DType::bf16) {
    convert_bf16_to_f32(static_cast<const uint16_t*>(base) + row * ld, dst, static_cast<std::size_t>(d));
  } else {
    std::memcpy(dst, static_cast<const float*>(base) + row * ld, static_cast<std::size_t>(d) * sizeof(float));
  }
}

}  // namespace

const TileKernels& tile_kernels(Isa isa) {
  static const TileKernels avx512 = make_kernels(Isa::avx512), avx2 = make_kernels(Isa::avx2), portable = make_kernels(Isa::portable);
  if (!isa_supported(isa)) throw Error("attention: this CPU cannot run the " + std::string(isa_name(isa)) + " kernels");
  return isa == Isa::avx512 ? avx512 : isa == Isa::avx2 ? avx2 : portable;
}

const TileKernels& tile_kernels() { return tile_kernels(gemm::best_isa()); }

FlashGeometry::FlashGeometry(const TileKernels& k, int64_t head_dim) : kernels(&k), d(head_dim) {
  // Full-width panels, then the rest in narrow panels (or one padded full panel when that is
  // fewer panels: 72 = 32 + 32 + 16 wastes 8 columns).
  int64_t col = 0;
  while (d - col >= k.pv_wide) {
    columns.push_back({col, k.pv_wide, k.pv_wide_kernel});
    col += k.pv_wide;
  }
  const int64_t rest = d - col;
  if (rest > k.pv_narrow) {
    columns.push_back({col, k.pv_wide, k.pv_wide_kernel});
    col += k.pv_wide;
  } else if (rest > 0) {
    columns.push_back({col, k.pv_narrow, k.pv_narrow_kernel});
    col += k.pv_narrow;
  }
  dp = col;
}

int64_t FlashGeometry::packed_k_floats(int64_t sk) const {
  const int64_t nr = kernels->nr;
  return (sk + nr - 1) / nr * nr * d;
}

void pack_kv_blocks(const FlashGeometry& g, const HeadProblem& head, DType dtype, int64_t kb_begin, int64_t kb_end, const PackedKV& out) {
  const int64_t d = g.d, nr = g.kernels->nr;
  std::vector<float> row(static_cast<std::size_t>(g.dp), 0.0f);
  for (int64_t kb = kb_begin; kb < kb_end; ++kb) {
    const int64_t key0 = kb * kBlockKeys, keys = std::min<int64_t>(kBlockKeys, head.sk - key0);
    // K: panels of nr keys, d x nr; keys past sk are zero.
    for (int64_t p0 = 0; p0 < keys; p0 += nr) {
      float* panel = out.k + (key0 + p0) * d;
      const int64_t n = std::min(nr, keys - p0);
      if (n < nr) std::fill(panel, panel + nr * d, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        load_row(head.k, head.k_ld, key0 + p0 + j, d, dtype, row.data());
        for (int64_t c = 0; c < d; ++c) panel[c * nr + j] = row[static_cast<std::size_t>(c)];
      }
    }
    // V: per column panel, keys x width, row-major; columns past d are zero.
    float* block = out.v + kb * kBlockKeys * g.dp;
    for (int64_t j = 0; j < keys; ++j) {
      load_row(head.v, head.v_ld, key0 + j, d, dtype, row.data());
      for (const ColumnPanel& cp : g.columns)
        std::memcpy(block + cp.col0 * kBlockKeys + j * cp.width, row.data() + cp.col0, static_cast<std::size_t>(cp.width) * sizeof(float));
    }
  }
}

QBlockState::QBlockState(const FlashGeometry& g)
    : q(static_cast<std::size_t>(kPanelsPerBlock * g.kernels->mr * g.d)),
      o(static_cast<std::size_t>(kPanelsPerBlock * g.kernels->mr * g.dp)),
      m(static_cast<std::size_t>(kPanelsPerBlock * g.kernels->mr)),
      l(m.size()),
      alpha(m.size()),
      row_cols(static_cast<std::size_t>(g.kernels->mr)) {}

void reset_q_block(const FlashGeometry& g, const HeadProblem& head, int64_t q0, QBlockState& st) {
  const int64_t mr = g.kernels->mr;
  st.q0 = q0;
  st.panels = static_cast<int>(std::min<int64_t>(kPanelsPerBlock, (head.sq - q0 + mr - 1) / mr));
  std::fill(st.m.begin(), st.m.end(), -std::numeric_limits<float>::infinity());
  std::fill(st.l.begin(), st.l.end(), 0.0f);
  std::fill(std::begin(st.o_started), std::end(st.o_started), false);
}

void begin_q_block(const FlashGeometry& g, const HeadProblem& head, DType dtype, int64_t q0, QBlockState& st) {
  const int64_t mr = g.kernels->mr, d = g.d;
  reset_q_block(g, head, q0, st);
  std::vector<float> row(static_cast<std::size_t>(d));
  for (int p = 0; p < st.panels; ++p) {
    float* panel = st.q.data() + p * mr * d;
    const int64_t r0 = q0 + p * mr, rows = std::min(mr, head.sq - r0);
    if (rows < mr) std::fill(panel, panel + mr * d, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      load_row(head.q, head.q_ld, r0 + r, d, dtype, row.data());
      for (int64_t c = 0; c < d; ++c) panel[c * mr + r] = row[static_cast<std::size_t>(c)];
    }
  }
}

namespace {

bool block_kept(const HeadProblem& head, int64_t row, int64_t kb) {
  return head.block_keep[(row / kSparseBlock) * head.block_ld + kb] != 0;
}

bool query_block_keeps_nothing(const HeadProblem& head, int64_t qb) {
  const uint8_t* row = head.block_keep + qb * head.block_ld;
  return std::all_of(row, row + FlashGeometry::key_blocks(head.sk), [](uint8_t b) { return b == 0; });
}

}  // namespace

bool panel_sees(const FlashGeometry& g, const HeadProblem& head, int64_t panel_q0, int64_t kb) {
  const int64_t last_row = std::min(panel_q0 + g.kernels->mr, head.sq) - 1;
  if (head.causal && kb * kBlockKeys > last_row + (head.sk - head.sq)) return false;
  // A panel of at most 128 rows spans at most two query blocks: its first and its last row's.
  if (head.block_keep) return block_kept(head, panel_q0, kb) || block_kept(head, last_row, kb);
  return true;
}

void qk_tile(const FlashGeometry& g, const HeadProblem& head, const PackedKV& kv, const QBlockState& st, int panel, int64_t kb, float* s) {
  const int64_t nr = g.kernels->nr, d = g.d;
  const int64_t key0 = kb * kBlockKeys, keys = std::min<int64_t>(kBlockKeys, head.sk - key0);
  const float* q = st.q.data() + panel * g.kernels->mr * d;
  for (int64_t p0 = 0; p0 < keys; p0 += nr) g.kernels->qk(d, q, kv.k + (key0 + p0) * d, s + p0, kBlockKeys, false);
}

void softmax_step(const FlashGeometry& g, const HeadProblem& head, float scale, int64_t q0_panel, int64_t kb, float* s, float* m, float* l,
                  float* alpha, uint16_t* p_bf16) {
  const int mr = g.kernels->mr;
  const int64_t key0 = kb * kBlockKeys, keys = std::min<int64_t>(kBlockKeys, head.sk - key0);
  const int rows_valid = static_cast<int>(std::clamp<int64_t>(head.sq - q0_panel, 0, mr));
  int32_t row_cols[64];
  SoftmaxTile t;
  t.s = s;
  t.rows = mr;
  t.cols = static_cast<int>(keys);
  if (head.causal) {
    for (int r = 0; r < mr; ++r)
      row_cols[r] = static_cast<int32_t>(std::clamp<int64_t>(q0_panel + r + (head.sk - head.sq) - key0 + 1, 0, keys));
    t.row_cols = row_cols;
  }
  if (head.mask) {
    t.mask = head.mask + q0_panel * head.mask_ld + key0;
    t.mask_ld = head.mask_ld;
    t.mask_rows = rows_valid;
  }
  if (head.bias) {
    t.bias = head.bias + q0_panel * head.bias_ld + key0;
    t.bias_ld = head.bias_ld;
    t.bias_rows = rows_valid;
  }
  // Block sparsity: rows of a query block that does not keep kb attend to nothing in this tile.
  uint8_t row_mask[64 * kBlockKeys];
  if (head.block_keep && rows_valid > 0 && block_kept(head, q0_panel, kb) != block_kept(head, q0_panel + rows_valid - 1, kb)) {
    for (int r = 0; r < rows_valid; ++r) {
      uint8_t* dst = row_mask + r * kBlockKeys;
      if (!block_kept(head, q0_panel + r, kb)) std::memset(dst, 0, kBlockKeys);
      else if (head.mask) std::memcpy(dst, head.mask + (q0_panel + r) * head.mask_ld + key0, static_cast<std::size_t>(keys));
      else std::memset(dst, 1, kBlockKeys);
    }
    t.mask = row_mask;
    t.mask_ld = kBlockKeys;
    t.mask_rows = rows_valid;
  }
  t.scale = scale;
  t.m = m;
  t.l = l;
  t.alpha = alpha;
  t.p_bf16 = p_bf16;
  g.kernels->softmax(t);
}

void pv_tile(const FlashGeometry& g, const HeadProblem& head, const PackedKV& kv, QBlockState& st, int panel, int64_t kb, const float* p,
             const float* alpha) {
  const int64_t mr = g.kernels->mr;
  const int64_t key0 = kb * kBlockKeys, keys = std::min<int64_t>(kBlockKeys, head.sk - key0);
  float* o = st.o.data() + panel * mr * g.dp;
  const float* block = kv.v + kb * kBlockKeys * g.dp;
  const float* scale_o = st.o_started[panel] ? alpha : nullptr;
  for (const ColumnPanel& cp : g.columns) cp.kernel(keys, p, block + cp.col0 * kBlockKeys, o + cp.col0, g.dp, scale_o);
  st.o_started[panel] = true;
}

void finish_q_block(const FlashGeometry& g, const HeadProblem& head, DType dtype, const QBlockState& st, const float* m, const float* l) {
  const int64_t mr = g.kernels->mr, d = g.d;
  std::vector<float> row(static_cast<std::size_t>(d));
  for (int p = 0; p < st.panels; ++p) {
    const int64_t r0 = st.q0 + p * mr, rows = std::min(mr, head.sq - r0);
    for (int64_t r = 0; r < rows; ++r) {
      const float sum = l[p * mr + r];
      const bool attended = sum > 0.0f && st.o_started[p];
      const float inv = attended ? 1.0f / sum : std::numeric_limits<float>::quiet_NaN();
      if (head.lse) head.lse[r0 + r] = attended ? m[p * mr + r] + std::log(sum) : -std::numeric_limits<float>::infinity();
      const bool zero = head.block_keep && query_block_keeps_nothing(head, (r0 + r) / kSparseBlock);
      const float* o = st.o.data() + (p * mr + r) * g.dp;
      for (int64_t c = 0; c < d; ++c) row[static_cast<std::size_t>(c)] = zero ? 0.0f : o[c] * inv;
      if (dtype == DType::bf16) {
        convert_f32_to_bf16(row.data(), static_cast<uint16_t*>(head.out) + (r0 + r) * head.out_ld, static_cast<std::size_t>(d));
      } else {
        std::memcpy(static_cast<float*>(head.out) + (r0 + r) * head.out_ld, row.data(), static_cast<std::size_t>(d) * sizeof(float));
      }
    }
  }
}

void walk_head_groups(const std::vector<HeadProblem>& heads, const std::function<int64_t(const HeadProblem&)>& packed_bytes,
                      const FlashGeometry& g, const std::function<void(const PackedHeadItem&)>& pack_block,
                      const std::function<void(int64_t begin, int64_t end, const HeadItemOf& item)>& run_q_blocks) {
  static const int64_t budget_bytes = std::clamp<int64_t>(gemm::this_cpu_caches().l3, int64_t{8} << 20, int64_t{64} << 20);
  std::size_t h0 = 0;
  while (h0 < heads.size()) {
    // [h0, h1): the group; each head's packing at its offset (64-byte aligned) in one scratch.
    std::vector<int64_t> offsets{0};
    std::size_t h1 = h0;
    while (h1 < heads.size()) {
      const int64_t size = (packed_bytes(heads[h1]) + 63) / 64 * 64;
      if (h1 > h0 && offsets.back() + size > budget_bytes) break;
      offsets.push_back(offsets.back() + size);
      ++h1;
    }
    Scratch packed((offsets.back() + 3) / 4);
    // (head, key block) and (head, q-block) index spaces of the group.
    std::vector<int64_t> kb_start{0}, qb_start{0};
    for (std::size_t h = h0; h < h1; ++h) {
      kb_start.push_back(kb_start.back() + FlashGeometry::key_blocks(heads[h].sk));
      qb_start.push_back(qb_start.back() + g.q_blocks(heads[h].sq));
    }
    auto item_of = [&](const std::vector<int64_t>& start, int64_t i) {
      const auto local = static_cast<std::size_t>(std::upper_bound(start.begin(), start.end(), i) - start.begin() - 1);
      return PackedHeadItem{h0 + local, i - start[local], reinterpret_cast<std::byte*>(packed.data()) + offsets[local]};
    };
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, kb_start.back()), [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t i = r.begin(); i < r.end(); ++i) pack_block(item_of(kb_start, i));
    });
    const HeadItemOf q_item = [&](int64_t i) { return item_of(qb_start, i); };
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, qb_start.back()),
                      [&](const tbb::blocked_range<int64_t>& r) { run_q_blocks(r.begin(), r.end(), q_item); });
    h0 = h1;
  }
}

Scratch::Scratch(int64_t floats)
    : ptr_(static_cast<float*>(default_allocator().allocate(static_cast<std::size_t>(std::max<int64_t>(floats, 1)) * sizeof(float)))) {}
Scratch::~Scratch() { default_allocator().deallocate(ptr_); }

}  // namespace cubevec::ops::attn
