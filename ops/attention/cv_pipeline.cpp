#include "ops/attention/cv_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include "device/spin_wait.h"
#include "ops/attention/flash_tiles.h"
#include "tensor/error.h"

namespace cubevec::ops::attn {

namespace {

// How long the Vector side waits for the next S tile before it leaves the lane to the Cube side
// (Note [CV pipeline without deadlock]); a tile takes tens of microseconds when both sides run.
constexpr double kVectorPatienceSeconds = 0.02;

std::atomic<int64_t> g_last_tiles{0}, g_last_vector_tiles{0};

struct Tile {
  int32_t head = 0;
  int32_t kb = 0;
  int64_t q0 = 0;
  bool first = false;  // first key block of its q-block
  bool last = false;   // last key block of its q-block
};

// Spins briefly, then yields the core (the other side may share it), until ready() or the deadline.
template <class Ready>
bool wait_for(Ready ready, double seconds) {
  if (spin_until(ready, std::min(seconds, 20e-6))) return true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return ready();
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

struct CvPipeline::Lane {
  const AttentionBatch* batch = nullptr;
  const FlashGeometry* g = nullptr;
  std::vector<Tile> tiles;
  std::vector<Tile> empty_jobs;  // q-blocks of heads without keys: NaN rows, no tiles

  // The queue: two S/P slots with the softmax outputs the Cube side needs.
  struct Slot {
    std::vector<float> s, alpha, final_l;
  } slots[2];
  // Online-softmax state of the q-block being normalized (owned by whichever side holds the claim).
  std::vector<float> m, l;

  alignas(64) std::atomic<int64_t> s_ready{-1};  // highest tile whose S is in its slot
  alignas(64) std::atomic<int64_t> claimed{0};   // tiles [0, claimed) are taken for the softmax
  alignas(64) std::atomic<int64_t> done{0};      // tiles [0, done) have P in their slot
  std::atomic<bool> vector_joined{false};
  std::atomic<bool> cube_failed{false};
  std::atomic<int64_t> vector_tiles{0};

  void init(const AttentionBatch& b, const FlashGeometry& geometry) {
    batch = &b;
    g = &geometry;
    const std::size_t rows = static_cast<std::size_t>(geometry.block_rows());
    for (auto& slot : slots) {
      slot.s.assign(rows * kBlockKeys, 0.0f);
      slot.alpha.assign(rows, 1.0f);
      slot.final_l.assign(rows, 0.0f);
    }
    m.assign(rows, 0.0f);
    l.assign(rows, 0.0f);
  }

  // The softmax of tile t, by whichever side claimed it.
  void softmax(int64_t t) {
    const Tile& tile = tiles[static_cast<std::size_t>(t)];
    const HeadProblem& head = batch->heads[static_cast<std::size_t>(tile.head)];
    Slot& slot = slots[t % 2];
    const int64_t mr = g->kernels->mr;
    if (tile.first) {
      std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.end(), 0.0f);
    }
    for (int p = 0; p < kPanelsPerBlock; ++p) {
      const int64_t q0 = tile.q0 + p * mr;
      if (q0 >= head.sq) break;
      if (head.causal && tile.kb * int64_t{kBlockKeys} > std::min(q0 + mr, head.sq) - 1 + (head.sk - head.sq)) continue;
      softmax_step(*g, head, batch->scale, q0, tile.kb, slot.s.data() + p * mr * kBlockKeys, m.data() + p * mr,
                   l.data() + p * mr, slot.alpha.data() + p * mr);
    }
    if (tile.last) std::copy(l.begin(), l.end(), slot.final_l.begin());
  }

  // Cube side: P(t) ready in its slot, computed by the Vector side or, if it is absent, here.
  void await_p(int64_t t) {
    const auto have_p = [&] { return done.load(std::memory_order_acquire) > t; };
    while (!have_p()) {
      int64_t expected = t;
      if (!vector_joined.load(std::memory_order_acquire) &&
          claimed.compare_exchange_strong(expected, t + 1, std::memory_order_acq_rel)) {
        softmax(t);
        done.store(t + 1, std::memory_order_release);
        return;
      }
      wait_for([&] { return have_p() || !vector_joined.load(std::memory_order_acquire); }, 1.0);
    }
  }

  void run_cube() {
    const int64_t count = static_cast<int64_t>(tiles.size());
    if (count == 0) return;
    const FlashGeometry& geo = *g;
    // Two of each: tile t+1's QK may start a new head or q-block while tile t's PV needs the old.
    int64_t max_sk = 0;
    for (const Tile& t : tiles) max_sk = std::max(max_sk, batch->heads[static_cast<std::size_t>(t.head)].sk);
    const int64_t kv_floats = geo.packed_k_floats(max_sk) + geo.packed_v_floats(max_sk);
    Scratch kv_scratch(2 * kv_floats);
    PackedKV kv[2];
    for (int i = 0; i < 2; ++i) kv[i] = {kv_scratch.data() + i * kv_floats, kv_scratch.data() + i * kv_floats + geo.packed_k_floats(max_sk)};
    QBlockState st0(geo), st1(geo);
    QBlockState* states[2] = {&st0, &st1};
    std::vector<int> kv_index(tiles.size()), st_index(tiles.size());
    int32_t packed_head = -1;
    int kv_next = 1, st_next = 1;
    const int64_t mr = geo.kernels->mr;

    auto produce = [&](int64_t t) {
      const Tile& tile = tiles[static_cast<std::size_t>(t)];
      const HeadProblem& head = batch->heads[static_cast<std::size_t>(tile.head)];
      if (tile.head != packed_head) {
        kv_next ^= 1;
        pack_kv_blocks(geo, head, batch->dtype, 0, FlashGeometry::key_blocks(head.sk), kv[kv_next]);
        packed_head = tile.head;
      }
      if (tile.first) {
        st_next ^= 1;
        begin_q_block(geo, head, batch->dtype, tile.q0, *states[st_next]);
      }
      kv_index[static_cast<std::size_t>(t)] = kv_next;
      st_index[static_cast<std::size_t>(t)] = st_next;
      QBlockState& st = *states[st_next];
      float* s = slots[t % 2].s.data();
      for (int p = 0; p < st.panels; ++p)
        if (panel_sees_block(geo, head, st, p, tile.kb)) qk_tile(geo, head, kv[kv_next], st, p, tile.kb, s + p * mr * kBlockKeys);
      s_ready.store(t, std::memory_order_release);
    };
    auto consume = [&](int64_t t) {
      const Tile& tile = tiles[static_cast<std::size_t>(t)];
      const HeadProblem& head = batch->heads[static_cast<std::size_t>(tile.head)];
      await_p(t);
      const Slot& slot = slots[t % 2];
      QBlockState& st = *states[st_index[static_cast<std::size_t>(t)]];
      const PackedKV& kvt = kv[kv_index[static_cast<std::size_t>(t)]];
      for (int p = 0; p < st.panels; ++p)
        if (panel_sees_block(geo, head, st, p, tile.kb))
          pv_tile(geo, head, kvt, st, p, tile.kb, slot.s.data() + p * mr * kBlockKeys, slot.alpha.data() + p * mr);
      if (tile.last) finish_q_block(geo, head, batch->dtype, st, slot.final_l.data());
    };
    try {
      produce(0);
      for (int64_t t = 0; t < count; ++t) {
        if (t + 1 < count) produce(t + 1);
        consume(t);
      }
    } catch (...) {
      cube_failed.store(true, std::memory_order_release);
      throw;
    }
  }

  void run_vector() {
    const int64_t count = static_cast<int64_t>(tiles.size());
    vector_joined.store(true, std::memory_order_release);
    for (;;) {
      const int64_t t = claimed.load(std::memory_order_acquire);
      if (t >= count || cube_failed.load(std::memory_order_acquire)) break;
      const bool ready = wait_for(
          [&] {
            return (s_ready.load(std::memory_order_acquire) >= t && done.load(std::memory_order_acquire) == t) ||
                   claimed.load(std::memory_order_acquire) != t || cube_failed.load(std::memory_order_acquire);
          },
          kVectorPatienceSeconds);
      if (!ready) break;  // the Cube side is elsewhere: leave the tiles to it
      int64_t expected = t;
      if (s_ready.load(std::memory_order_acquire) >= t && done.load(std::memory_order_acquire) == t &&
          claimed.compare_exchange_strong(expected, t + 1, std::memory_order_acq_rel)) {
        softmax(t);
        vector_tiles.fetch_add(1, std::memory_order_relaxed);
        done.store(t + 1, std::memory_order_release);
      }
    }
    vector_joined.store(false, std::memory_order_release);
  }
};

CvPipeline::CvPipeline(AttentionBatch batch, int lanes) : batch_(std::move(batch)), lane_count_(std::max(lanes, 1)) {
  static_assert(kPanelsPerBlock > 0);
  geometry_ = std::make_unique<FlashGeometry>(tile_kernels(), batch_.d);
  lanes_ = std::make_unique<Lane[]>(static_cast<std::size_t>(lane_count_));
  // (head, q-block) jobs in order, cut into lanes of about equal work.
  struct Job {
    int32_t head;
    int64_t q0;
    double work;
  };
  std::vector<Job> jobs;
  double total = 0;
  for (std::size_t h = 0; h < batch_.heads.size(); ++h) {
    const HeadProblem& head = batch_.heads[h];
    for (int64_t q0 = 0; q0 < head.sq; q0 += geometry_->block_rows()) {
      const double work = static_cast<double>(std::min(geometry_->block_rows(), head.sq - q0)) * static_cast<double>(head.sk);
      jobs.push_back({static_cast<int32_t>(h), q0, work});
      total += work;
    }
  }
  double acc = 0;
  for (const Job& job : jobs) {
    const int lane = std::min(lane_count_ - 1, static_cast<int>(acc / std::max(total, 1.0) * lane_count_));
    acc += job.work;
    Lane& ln = lanes_[static_cast<std::size_t>(lane)];
    const HeadProblem& head = batch_.heads[static_cast<std::size_t>(job.head)];
    QBlockState probe(*geometry_);
    probe.q0 = job.q0;
    probe.panels = static_cast<int>(std::min<int64_t>(kPanelsPerBlock, (head.sq - job.q0 + geometry_->kernels->mr - 1) /
                                                                           geometry_->kernels->mr));
    const std::size_t first = ln.tiles.size();
    for (int64_t kb = 0; kb < FlashGeometry::key_blocks(head.sk); ++kb) {
      bool any = false;
      for (int p = 0; p < probe.panels && !any; ++p) any = panel_sees_block(*geometry_, head, probe, p, kb);
      if (!any) break;
      ln.tiles.push_back({job.head, static_cast<int32_t>(kb), job.q0, false, false});
    }
    if (ln.tiles.size() > first) {
      ln.tiles[first].first = true;
      ln.tiles.back().last = true;
    } else {
      // No key to see at all (sk == 0): the rows still come out, as NaN.
      ln.empty_jobs.push_back({job.head, 0, job.q0, true, true});
    }
  }
  for (int i = 0; i < lane_count_; ++i) lanes_[static_cast<std::size_t>(i)].init(batch_, *geometry_);
}

CvPipeline::~CvPipeline() = default;

// One task per lane (simple_partitioner: lanes are few and long, nothing to gain from splitting).
void CvPipeline::run_cube() {
  tbb::parallel_for(tbb::blocked_range<int>(0, lane_count_, 1), [&](const tbb::blocked_range<int>& range) {
    for (int i = range.begin(); i < range.end(); ++i) run_cube_lane(i);
  }, tbb::simple_partitioner());
  const CvPipelineStats s = stats();
  g_last_tiles.store(s.tiles);
  g_last_vector_tiles.store(s.vector_tiles);
}

void CvPipeline::run_cube_lane(int i) {
  Lane& lane = lanes_[static_cast<std::size_t>(i)];
  for (const Tile& job : lane.empty_jobs) {
    const HeadProblem& head = batch_.heads[static_cast<std::size_t>(job.head)];
    QBlockState st(*geometry_);
    begin_q_block(*geometry_, head, batch_.dtype, job.q0, st);
    finish_q_block(*geometry_, head, batch_.dtype, st, st.l.data());
  }
  lane.run_cube();
}

void CvPipeline::run_vector() {
  tbb::parallel_for(tbb::blocked_range<int>(0, lane_count_, 1), [&](const tbb::blocked_range<int>& range) {
    for (int i = range.begin(); i < range.end(); ++i) lanes_[static_cast<std::size_t>(i)].run_vector();
  }, tbb::simple_partitioner());
}

CvPipelineStats CvPipeline::stats() const {
  CvPipelineStats s;
  for (int i = 0; i < lane_count_; ++i) {
    s.tiles += static_cast<int64_t>(lanes_[static_cast<std::size_t>(i)].tiles.size());
    s.vector_tiles += lanes_[static_cast<std::size_t>(i)].vector_tiles.load();
  }
  return s;
}

CvPipelineStats last_cv_pipeline_stats() { return {g_last_tiles.load(), g_last_vector_tiles.load()}; }

}  // namespace cubevec::ops::attn
