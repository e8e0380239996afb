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

#include <immintrin.h>

#include "device/spin_wait.h"
#include "ops/attention/flash_tiles.h"
#include "base/error.h"

namespace cubevec::ops::attn {

namespace {

// How long the Vector side waits for the next S tile before it leaves the lane to the Cube side
// (Note [CV pipeline without deadlock]); a tile takes tens of microseconds when both sides run.
constexpr double kVectorPatienceSeconds = 0.02;

std::atomic<int64_t> g_last_tiles{0}, g_last_vector_tiles{0}, g_last_heads{0}, g_last_vector_packs{0};

struct Tile {
  int32_t head = 0;
  int32_t kb = 0;
  int64_t q0 = 0;
  bool first = false;  // first key block of its q-block
  bool last = false;   // last key block of its q-block
};

// Spins 20 us, then yields the core (the other side may share it), until ready() or the deadline.
template <class Ready>
bool wait_for(Ready ready, double seconds) {
  return spin_until(ready, seconds, 20e-6);
}

}  // namespace

struct CvPipeline::Lane {
  const AttentionBatch* batch = nullptr;
  const FlashGeometry* g = nullptr;
  std::vector<Tile> tiles;
  std::vector<Tile> empty_jobs;  // q-blocks of heads without keys: NaN rows, no tiles

  // K/V packing, the Vector side's second job: the lane's heads in tile order, each packed into
  // buffer (its position % 2) by whichever side claims it first (0 free, 1 claimed, 2 packed).
  // Head j may be packed once head j - 2, the buffer's previous user, is consumed.
  std::vector<int32_t> head_order;
  std::vector<int32_t> head_seq_of_tile;
  std::unique_ptr<std::atomic<int>[]> pack_state;
  PackedKV kv[2];
  std::unique_ptr<Scratch> kv_scratch;
  alignas(64) std::atomic<int64_t> heads_released{0};  // heads [0, released) fully consumed by the Cube side
  std::atomic<int64_t> vector_packs{0};

  // The queue: two S/P slots with the softmax outputs the Cube side needs.
  struct Slot {
    std::vector<float> s, alpha, final_m, final_l;
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
      slot.final_m.assign(rows, 0.0f);
      slot.final_l.assign(rows, 0.0f);
    }
    m.assign(rows, 0.0f);
    l.assign(rows, 0.0f);
    head_seq_of_tile.resize(tiles.size());
    for (std::size_t i = 0; i < tiles.size(); ++i) {
      if (head_order.empty() || head_order.back() != tiles[i].head) head_order.push_back(tiles[i].head);
      head_seq_of_tile[i] = static_cast<int32_t>(head_order.size() - 1);
    }
    pack_state = std::make_unique<std::atomic<int>[]>(head_order.size());
    int64_t max_sk = 0;
    for (int32_t h : head_order) max_sk = std::max(max_sk, b.heads[static_cast<std::size_t>(h)].sk);
    const int64_t k_floats = geometry.packed_k_floats(max_sk), kv_floats = k_floats + geometry.packed_v_floats(max_sk);
    if (!head_order.empty()) {
      kv_scratch = std::make_unique<Scratch>(2 * kv_floats);
      for (int i = 0; i < 2; ++i) kv[i] = {kv_scratch->data() + i * kv_floats, kv_scratch->data() + i * kv_floats + k_floats};
    }
  }

  // Packs head sequence j if it is free and its buffer is; true if this call packed it.
  bool try_pack(int64_t j) {
    if (j >= static_cast<int64_t>(head_order.size()) || heads_released.load(std::memory_order_acquire) < j - 1) return false;
    int expected = 0;
    if (!pack_state[static_cast<std::size_t>(j)].compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) return false;
    const HeadProblem& head = batch->heads[static_cast<std::size_t>(head_order[static_cast<std::size_t>(j)])];
    pack_kv_blocks(*g, head, batch->dtype, 0, FlashGeometry::key_blocks(head.sk), kv[j % 2]);
    pack_state[static_cast<std::size_t>(j)].store(2, std::memory_order_release);
    return true;
  }

  // Cube side: head sequence j packed in kv[j % 2], here if nobody has started it.
  void await_pack(int64_t j) {
    if (try_pack(j)) return;
    wait_for([&] { return pack_state[static_cast<std::size_t>(j)].load(std::memory_order_acquire) == 2; }, 1e9);
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
      if (!panel_sees(*g, head, q0, tile.kb)) continue;
      softmax_step(*g, head, batch->scale, q0, tile.kb, slot.s.data() + p * mr * kBlockKeys, m.data() + p * mr, l.data() + p * mr,
                   slot.alpha.data() + p * mr);
    }
    if (tile.last) {
      std::copy(m.begin(), m.end(), slot.final_m.begin());
      std::copy(l.begin(), l.end(), slot.final_l.begin());
    }
  }

  // Cube side: P(t) ready in its slot, computed by the Vector side or, if it is absent, here.
  void await_p(int64_t t) {
    const auto have_p = [&] { return done.load(std::memory_order_acquire) > t; };
    while (!have_p()) {
      int64_t expected = t;
      if (!vector_joined.load(std::memory_order_acquire) && claimed.compare_exchange_strong(expected, t + 1, std::memory_order_acq_rel)) {
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
    QBlockState st0(geo), st1(geo);
    QBlockState* states[2] = {&st0, &st1};
    std::vector<int> st_index(tiles.size());
    int st_next = 1;
    const int64_t mr = geo.kernels->mr;

    auto produce = [&](int64_t t) {
      const Tile& tile = tiles[static_cast<std::size_t>(t)];
      const HeadProblem& head = batch->heads[static_cast<std::size_t>(tile.head)];
      const int32_t seq = head_seq_of_tile[static_cast<std::size_t>(t)];
      if (t == 0 || head_seq_of_tile[static_cast<std::size_t>(t - 1)] != seq) await_pack(seq);
      if (tile.first) {
        st_next ^= 1;
        begin_q_block(geo, head, batch->dtype, tile.q0, *states[st_next]);
      }
      st_index[static_cast<std::size_t>(t)] = st_next;
      QBlockState& st = *states[st_next];
      float* s = slots[t % 2].s.data();
      for (int p = 0; p < st.panels; ++p)
        if (panel_sees_block(geo, head, st, p, tile.kb)) qk_tile(geo, head, kv[seq % 2], st, p, tile.kb, s + p * mr * kBlockKeys);
      s_ready.store(t, std::memory_order_release);
    };
    auto consume = [&](int64_t t) {
      const Tile& tile = tiles[static_cast<std::size_t>(t)];
      const HeadProblem& head = batch->heads[static_cast<std::size_t>(tile.head)];
      await_p(t);
      const Slot& slot = slots[t % 2];
      QBlockState& st = *states[st_index[static_cast<std::size_t>(t)]];
      const int32_t seq = head_seq_of_tile[static_cast<std::size_t>(t)];
      const PackedKV& kvt = kv[seq % 2];
      for (int p = 0; p < st.panels; ++p)
        if (panel_sees_block(geo, head, st, p, tile.kb))
          pv_tile(geo, head, kvt, st, p, tile.kb, slot.s.data() + p * mr * kBlockKeys, slot.alpha.data() + p * mr);
      if (tile.last) finish_q_block(geo, head, batch->dtype, st, slot.final_m.data(), slot.final_l.data());
      const bool head_done = t + 1 == static_cast<int64_t>(tiles.size()) || head_seq_of_tile[static_cast<std::size_t>(t + 1)] != seq;
      if (head_done) heads_released.store(seq + 1, std::memory_order_release);
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

  // The Vector side: the softmax of each tile as soon as its S is ready (the Cube side waits for
  // it), and, while it would otherwise wait, the packing of upcoming heads' K and V.
  void run_vector() {
    const int64_t count = static_cast<int64_t>(tiles.size());
    vector_joined.store(true, std::memory_order_release);
    int64_t next_pack = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kVectorPatienceSeconds);
    int idle = 0;
    for (;;) {
      const int64_t t = claimed.load(std::memory_order_acquire);
      if (t >= count || cube_failed.load(std::memory_order_acquire)) break;
      if (s_ready.load(std::memory_order_acquire) >= t && done.load(std::memory_order_acquire) == t) {
        int64_t expected = t;
        if (claimed.compare_exchange_strong(expected, t + 1, std::memory_order_acq_rel)) {
          softmax(t);
          vector_tiles.fetch_add(1, std::memory_order_relaxed);
          done.store(t + 1, std::memory_order_release);
        }
      } else {
        while (next_pack < static_cast<int64_t>(head_order.size()) &&
               pack_state[static_cast<std::size_t>(next_pack)].load(std::memory_order_acquire) != 0)
          ++next_pack;
        if (try_pack(next_pack)) {
          vector_packs.fetch_add(1, std::memory_order_relaxed);
        } else {
          // Nothing to do: spin a little, then yield the core; give up after the patience runs out.
          if (++idle < 64) {
            for (int i = 0; i < 16; ++i) _mm_pause();
          } else {
            if (std::chrono::steady_clock::now() > deadline) break;  // the Cube side is elsewhere
            std::this_thread::yield();
          }
          continue;
        }
      }
      idle = 0;
      deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kVectorPatienceSeconds);
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
    probe.panels =
        static_cast<int>(std::min<int64_t>(kPanelsPerBlock, (head.sq - job.q0 + geometry_->kernels->mr - 1) / geometry_->kernels->mr));
    const std::size_t first = ln.tiles.size();
    for (int64_t kb = 0; kb < FlashGeometry::key_blocks(head.sk); ++kb) {
      bool any = false;
      for (int p = 0; p < probe.panels && !any; ++p) any = panel_sees_block(*geometry_, head, probe, p, kb);
      if (!any) {
        if (later_blocks_unseen_too(head)) break;
        continue;
      }
      ln.tiles.push_back({job.head, static_cast<int32_t>(kb), job.q0, false, false});
    }
    if (ln.tiles.size() > first) {
      ln.tiles[first].first = true;
      ln.tiles.back().last = true;
    } else {
      // No key to see at all (sk == 0, or a query block that keeps none): the rows still come out,
      // as NaN (zero under block sparsity).
      ln.empty_jobs.push_back({job.head, 0, job.q0, true, true});
    }
  }
  for (int i = 0; i < lane_count_; ++i) lanes_[static_cast<std::size_t>(i)].init(batch_, *geometry_);
}

CvPipeline::~CvPipeline() = default;

// One task per lane (simple_partitioner: lanes are few and long, nothing to gain from splitting).
void CvPipeline::run_cube() {
  tbb::parallel_for(
      tbb::blocked_range<int>(0, lane_count_, 1),
      [&](const tbb::blocked_range<int>& range) {
        for (int i = range.begin(); i < range.end(); ++i) run_cube_lane(i);
      },
      tbb::simple_partitioner());
  const CvPipelineStats s = stats();
  g_last_tiles.store(s.tiles);
  g_last_vector_tiles.store(s.vector_tiles);
  g_last_heads.store(s.heads);
  g_last_vector_packs.store(s.vector_packs);
}

void CvPipeline::run_cube_lane(int i) {
  Lane& lane = lanes_[static_cast<std::size_t>(i)];
  for (const Tile& job : lane.empty_jobs) {
    const HeadProblem& head = batch_.heads[static_cast<std::size_t>(job.head)];
    QBlockState st(*geometry_);
    begin_q_block(*geometry_, head, batch_.dtype, job.q0, st);
    finish_q_block(*geometry_, head, batch_.dtype, st, st.m.data(), st.l.data());
  }
  lane.run_cube();
}

void CvPipeline::run_vector() {
  tbb::parallel_for(
      tbb::blocked_range<int>(0, lane_count_, 1),
      [&](const tbb::blocked_range<int>& range) {
        for (int i = range.begin(); i < range.end(); ++i) lanes_[static_cast<std::size_t>(i)].run_vector();
      },
      tbb::simple_partitioner());
}

CvPipelineStats CvPipeline::stats() const {
  CvPipelineStats s;
  for (int i = 0; i < lane_count_; ++i) {
    s.tiles += static_cast<int64_t>(lanes_[static_cast<std::size_t>(i)].tiles.size());
    s.vector_tiles += lanes_[static_cast<std::size_t>(i)].vector_tiles.load();
    s.heads += static_cast<int64_t>(lanes_[static_cast<std::size_t>(i)].head_order.size());
    s.vector_packs += lanes_[static_cast<std::size_t>(i)].vector_packs.load();
  }
  return s;
}

CvPipelineStats last_cv_pipeline_stats() {
  return {g_last_tiles.load(), g_last_vector_tiles.load(), g_last_heads.load(), g_last_vector_packs.load()};
}

}  // namespace cubevec::ops::attn
