// The building blocks shared by tiled flash attention (flash.cpp) and its CV-pipelined form
// (cv_pipeline.cpp): the ISA's tile kernels, K/V packed once per head, Q packed per micro-panel,
// the three tile steps and the final normalization.
//
// Tiles: a q-block is kPanelsPerBlock micro-panels of MR query rows; it walks the head's keys in
// blocks of kBlockKeys. K is packed in NR-key panels (d x NR, k-major) for the QK micro-kernel; V
// per key block in column panels (kBlockKeys x W, W the PV kernel's width, columns past d zero),
// so any head dim runs on full-width kernels with at most one narrow or padded column panel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "ops/attention/problem.h"
#include "ops/attention/tile_kernels.h"
#include "ops/isa.h"

namespace cubevec::ops::attn {

inline constexpr int kPanelsPerBlock = 4;

// The tile kernels of the widest ISA the GEMM may use (CUBEVEC_GEMM_ISA narrows it).
const TileKernels& tile_kernels();
const TileKernels& tile_kernels(Isa isa);

struct ColumnPanel {
  int64_t col0 = 0;
  int width = 0;
  PvKernel kernel = nullptr;
};

// Sizes that depend on the head dim and the kernels, not on a head.
struct FlashGeometry {
  FlashGeometry(const TileKernels& kernels, int64_t d);
  const TileKernels* kernels;
  int64_t d;
  int64_t dp = 0;  // d padded to the column panels
  std::vector<ColumnPanel> columns;
  int64_t block_rows() const { return int64_t{kPanelsPerBlock} * kernels->mr; }
  int64_t q_blocks(int64_t sq) const { return (sq + block_rows() - 1) / block_rows(); }
  static int64_t key_blocks(int64_t sk) { return (sk + kBlockKeys - 1) / kBlockKeys; }
  int64_t packed_k_floats(int64_t sk) const;
  int64_t packed_v_floats(int64_t sk) const { return key_blocks(sk) * kBlockKeys * dp; }
};

// One head's K and V in the packed layouts above.
struct PackedKV {
  float* k = nullptr;
  float* v = nullptr;
};
// Packs key blocks [kb_begin, kb_end) of `head` (callers split the blocks over threads).
void pack_kv_blocks(const FlashGeometry& g, const HeadProblem& head, DType dtype, int64_t kb_begin, int64_t kb_end, const PackedKV& out);

// Per q-block scratch: packed Q panels, S/P tile(s), O accumulators and the softmax state.
struct QBlockState {
  explicit QBlockState(const FlashGeometry& g);
  std::vector<float> q;            // kPanelsPerBlock panels of d x MR
  std::vector<float> o;            // kPanelsPerBlock x MR x dp
  std::vector<float> m, l, alpha;  // kPanelsPerBlock x MR each
  std::vector<int32_t> row_cols;   // MR, for causal prefixes
  bool o_started[kPanelsPerBlock] = {};
  int64_t q0 = 0;  // first query row of the block
  int panels = 0;  // micro-panels holding at least one query row
};

// Resets `st` for the q-block starting at row q0 and packs its Q rows.
void begin_q_block(const FlashGeometry& g, const HeadProblem& head, DType dtype, int64_t q0, QBlockState& st);
// The reset alone (kernels that pack Q their own way).
void reset_q_block(const FlashGeometry& g, const HeadProblem& head, int64_t q0, QBlockState& st);

// Whether key block kb holds any key that the micro-panel starting at query row panel_q0 may see
// (false for causal blocks entirely above the diagonal, and for key blocks that no query block of
// the panel's rows keeps under block sparsity).
bool panel_sees(const FlashGeometry& g, const HeadProblem& head, int64_t panel_q0, int64_t kb);
inline bool panel_sees_block(const FlashGeometry& g, const HeadProblem& head, const QBlockState& st, int panel, int64_t kb) {
  return panel_sees(g, head, st.q0 + panel * g.kernels->mr, kb);
}
// Whether a key block the tile loop found unseen by a whole q-block means every later one is too
// (causal attention without block sparsity), so the walk over key blocks can stop.
inline bool later_blocks_unseen_too(const HeadProblem& head) { return head.causal && !head.block_keep; }

// S (MR x kBlockKeys) = the panel's Q times key block kb's keys^T.
void qk_tile(const FlashGeometry& g, const HeadProblem& head, const PackedKV& kv, const QBlockState& st, int panel, int64_t kb, float* s);
// The softmax step on S for `panel` against key block kb: masks, updates m and l, writes P into S
// (or, for kernels that write bf16 P, into p_bf16: SoftmaxTile) and the rescale factors into alpha
// (MR floats). Under block sparsity, a panel whose rows span two query blocks of which only one
// keeps kb masks the other's rows out of this tile.
void softmax_step(const FlashGeometry& g, const HeadProblem& head, float scale, int64_t q0_panel, int64_t kb, float* s, float* m, float* l,
                  float* alpha, uint16_t* p_bf16 = nullptr);
// O_panel = alpha * O_panel + P V_block (O starts at zero on the panel's first block).
void pv_tile(const FlashGeometry& g, const HeadProblem& head, const PackedKV& kv, QBlockState& st, int panel, int64_t kb, const float* p,
             const float* alpha);
// out rows of the block = O / l (NaN for a row that attended to no key; zero for a row whose query
// block keeps no key block under block sparsity); head.lse, if asked for, = m + log(l).
void finish_q_block(const FlashGeometry& g, const HeadProblem& head, DType dtype, const QBlockState& st, const float* m, const float* l);

// The walk both flash kernels take (flash.cpp, flash_amx.cpp): heads in groups whose packed K and V
// (`packed_bytes(head)` each) fit the CPU's last-level cache together (as it reports it, clamped to
// 8-64 MiB so that small problems still keep every thread busy; a head alone may exceed it); per group,
// one scratch for the packings, then `pack_block` on every (head, key block) of the group in
// parallel, then `run_q_blocks` on contiguous ranges of its (head, q-block) items in parallel (each
// range can keep its own state; `item(i)` names the i-th).
struct PackedHeadItem {
  std::size_t head = 0;         // index into the batch's heads
  int64_t index = 0;            // the key block or q-block within the head
  std::byte* packed = nullptr;  // the head's packed K and V
};
using HeadItemOf = std::function<PackedHeadItem(int64_t)>;
void walk_head_groups(const std::vector<HeadProblem>& heads, const std::function<int64_t(const HeadProblem&)>& packed_bytes,
                      const FlashGeometry& g, const std::function<void(const PackedHeadItem&)>& pack_block,
                      const std::function<void(int64_t begin, int64_t end, const HeadItemOf& item)>& run_q_blocks);

// Scratch from the caching allocator (the same blocks come back call after call).
class Scratch {
 public:
  explicit Scratch(int64_t floats);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* data() const { return ptr_; }

 private:
  float* ptr_;
};

}  // namespace cubevec::ops::attn
