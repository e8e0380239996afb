// Collectives across ranks (run under mpirun with 2 and 4 ranks): every rank builds every rank's
// input from the same formula, so each can check what it receives against a plain loop.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "device/device.h"
#include "parallel/collectives.h"
#include "parallel/mpi_runtime.h"
#include "parallel/plan.h"

namespace cubevec::parallel {
namespace collectives_mpi_test {  // named after the file: unity batches never mix two files' helpers

// The value of element `i` of rank `r`'s input in test `salt`.
float value(int r, int64_t i, int salt) { return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * r + 0.11 * salt)); }

Tensor filled(const Shape& shape, int r, int salt) {
  const int64_t n = shape_numel(shape);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = value(r, i, salt);
  return Tensor::from_vector(v, shape);
}

// Element (i0, i1, i2) of a contiguous 3-D shape.
int64_t at3(const Shape& s, int64_t a, int64_t b, int64_t c) { return (a * s[1] + b) * s[2] + c; }

TEST(Collectives, AllGatherConcatenatesUnevenBlocksAlongAnInnerDim) {
  const Communicator comm = Communicator::world();
  const int P = comm.size();
  Device& device = default_device();
  const Stream stream = device.default_stream();
  // Rank r holds [2, r + 1, 3]: joined along dim 1, so the blocks must be interleaved, not appended.
  std::vector<int64_t> sizes;
  for (int r = 0; r < P; ++r) sizes.push_back(r + 1);
  const Tensor x = filled({2, comm.rank() + 1, 3}, comm.rank(), 1);
  const Tensor got = all_gather(x, 1, comm, stream, "test.gather", sizes);
  stream.synchronize();
  int64_t total = 0;
  for (const int64_t s : sizes) total += s;
  ASSERT_EQ(got.shape(), (Shape{2, total, 3}));
  const float* g = got.data<float>();
  for (int64_t a = 0; a < 2; ++a) {
    int64_t row = 0;
    for (int r = 0; r < P; ++r)
      for (int64_t b = 0; b < sizes[static_cast<std::size_t>(r)]; ++b, ++row)
        for (int64_t c = 0; c < 3; ++c)
          ASSERT_EQ(g[at3(got.shape(), a, row, c)], value(r, at3({2, r + 1, 3}, a, b, c), 1)) << "rank " << r << " a " << a;
  }
}

TEST(Collectives, UlyssesAllToAllSwitchesSequenceForHeadsAndBack) {
  const Communicator comm = Communicator::world();
  const int P = comm.size();
  const Stream stream = default_device().default_stream();
  // A global [1, S, H, D] with S and H not divisible by P: uneven sequence and head parts.
  const int64_t S = 4 * P + 1, H = 2 * P + 1, D = 3;
  const std::vector<int64_t> seq = split_sizes(S, P), heads = split_sizes(H, P);
  int64_t s0 = 0, h0 = 0;
  for (int r = 0; r < comm.rank(); ++r) s0 += seq[static_cast<std::size_t>(r)], h0 += heads[static_cast<std::size_t>(r)];
  const int64_t my_s = seq[static_cast<std::size_t>(comm.rank())], my_h = heads[static_cast<std::size_t>(comm.rank())];
  const auto global = [&](int64_t s, int64_t h, int64_t d) { return value(0, (s * H + h) * D + d, 2); };
  std::vector<float> local(static_cast<std::size_t>(my_s * H * D));
  for (int64_t s = 0; s < my_s; ++s)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) local[static_cast<std::size_t>((s * H + h) * D + d)] = global(s0 + s, h, d);
  const Tensor x = Tensor::from_vector(local, {1, my_s, H, D});

  const Tensor by_heads = all_to_all(x, 2, 1, comm, stream, "test.q", seq);
  const Tensor back = all_to_all(by_heads, 1, 2, comm, stream, "test.o", heads);
  stream.synchronize();
  ASSERT_EQ(by_heads.shape(), (Shape{1, S, my_h, D}));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t h = 0; h < my_h; ++h)
      for (int64_t d = 0; d < D; ++d) ASSERT_EQ(by_heads.at<float>({0, s, h, d}), global(s, h0 + h, d)) << s << " " << h;
  ASSERT_EQ(back.shape(), x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(back.data<float>()[i], x.data<float>()[i]) << i;
}

TEST(Collectives, AllReduceSumsEveryRanksTensor) {
  const Communicator comm = Communicator::world();
  const Stream stream = default_device().default_stream();
  const Shape shape{5, 7};
  const Tensor x = filled(shape, comm.rank(), 3);
  const Tensor sum = all_reduce_sum(x.transpose(0, 1), comm, stream, "test.sum");  // any strides in
  stream.synchronize();
  ASSERT_EQ(sum.shape(), (Shape{7, 5}));
  for (int64_t i = 0; i < 7; ++i)
    for (int64_t j = 0; j < 5; ++j) {
      double expected = 0;
      for (int r = 0; r < comm.size(); ++r) expected += value(r, j * 7 + i, 3);
      ASSERT_NEAR(sum.at<float>({i, j}), expected, 1e-6) << i << " " << j;
    }
}

TEST(Collectives, SendRecvPassesBlocksAroundTheRing) {
  const Communicator comm = Communicator::world();
  const int P = comm.size(), r = comm.rank();
  const Stream stream = default_device().default_stream();
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  // Rank r's block has r + 2 rows, so each receiver must expect its sender's size.
  const Tensor x = filled({r + 2, 4}, r, 4);
  const Tensor got = send_recv(x, next, prev, {prev + 2, 4}, comm, stream, "test.ring");
  stream.synchronize();
  for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.data<float>()[i], value(prev, i, 4)) << i;
}

TEST(Collectives, SplitMakesGroupsThatTalkAmongThemselves) {
  const Communicator world = Communicator::world();
  const Communicator pairs = world.split("parity", world.rank() % 2);
  const Stream stream = default_device().default_stream();
  const Tensor x = filled({1, 2}, world.rank(), 5);
  const Tensor got = all_gather(x, 0, pairs, stream, "test.parity");
  stream.synchronize();
  ASSERT_EQ(got.size(0), pairs.size());
  for (int m = 0; m < pairs.size(); ++m) {
    const int w = pairs.world_rank_of(m);
    EXPECT_EQ(w % 2, world.rank() % 2);
    for (int64_t j = 0; j < 2; ++j) ASSERT_EQ(got.at<float>({m, j}), value(w, j, 5));
  }
}

// Every split of the ranks into ulysses x ring x cfg x tp: the groups hold the ranks of the layout
// world = ((cfg * R + ring) * U + ulysses) * T + tp, each member at its index.
TEST(ParallelPlan, GroupsFollowTheCfgRingUlyssesTpLayout) {
  const int P = Communicator::world().size(), rank = Communicator::world().rank();
  for (int c : {1, 2})
    for (int t = 1; t <= P; ++t)
      for (int u = 1; u <= P; ++u) {
        if (P % (u * c * t) != 0) continue;
        const ParallelDegrees degrees{u, P / (u * c * t), c, t};
        const std::string what = degrees.describe() + " on rank " + std::to_string(rank);
        const ParallelGroups groups = make_parallel_groups(degrees);
        const int r = degrees.ring, ti = rank % t, ui = (rank / t) % u, ri = (rank / (t * u)) % r, ci = rank / (t * u * r);
        const auto world_rank = [&](int cfg, int ring, int ulysses, int tp) { return ((cfg * r + ring) * u + ulysses) * t + tp; };
        ASSERT_EQ(groups.tp.size(), t) << what;
        ASSERT_EQ(groups.ulysses.size(), u) << what;
        ASSERT_EQ(groups.ring.size(), r) << what;
        ASSERT_EQ(groups.cfg.size(), c) << what;
        EXPECT_EQ(groups.tp.rank(), ti) << what;
        EXPECT_EQ(groups.ulysses.rank(), ui) << what;
        EXPECT_EQ(groups.ring.rank(), ri) << what;
        EXPECT_EQ(groups.cfg.rank(), ci) << what;
        for (int m = 0; m < t; ++m) EXPECT_EQ(groups.tp.world_rank_of(m), world_rank(ci, ri, ui, m)) << what;
        for (int m = 0; m < u; ++m) EXPECT_EQ(groups.ulysses.world_rank_of(m), world_rank(ci, ri, m, ti)) << what;
        for (int m = 0; m < r; ++m) EXPECT_EQ(groups.ring.world_rank_of(m), world_rank(ci, m, ui, ti)) << what;
        for (int m = 0; m < c; ++m) EXPECT_EQ(groups.cfg.world_rank_of(m), world_rank(m, ri, ui, ti)) << what;
      }
}

TEST(Collectives, CommunicationKernelsRunOnTheCommUnitAndAreModelled) {
  const Communicator comm = Communicator::world();
  DeviceProfile profile = builtin_cpu_profile();
  Device device(profile, {.simulate = false, .trace = true});
  const Stream stream = device.default_stream();
  const Tensor x = filled({64, 16}, comm.rank(), 6);
  const Tensor got = all_gather(x, 0, comm, stream, "test.traced");
  stream.synchronize();
  bool found = false;
  for (const KernelRecord& k : device.trace().records())
    if (k.desc.name == "all_gather test.traced") {
      found = true;
      EXPECT_EQ(k.desc.unit, Unit::comm);
      EXPECT_DOUBLE_EQ(k.desc.bytes, comm.size() > 1 ? 64.0 * 16 * 4 : 0.0);
      const double modelled = k.modelled_end_s - k.modelled_start_s;
      EXPECT_NEAR(modelled, k.desc.bytes / (profile.peer_gbps * 1e9) + profile.peer_latency_us * 1e-6 + profile.launch_overhead_us * 1e-6,
                  1e-12);
    }
  EXPECT_TRUE(found);
  EXPECT_EQ(device.stats().kernels_per_unit[static_cast<std::size_t>(Unit::comm)], 1u);
}

TEST(Collectives, RanksInDifferentCollectivesGetAnErrorNamingBoth) {
  const Communicator comm = Communicator::world();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const Stream stream = default_device().default_stream();
  const Tensor x = filled({4}, comm.rank(), 7);
  try {
    if (comm.rank() == 0) all_gather(x, 0, comm, stream, "left");
    else all_reduce_sum(x, comm, stream, "right");
    stream.synchronize();
    FAIL() << "mismatched collectives were not refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ranks disagree"), std::string::npos) << m;
    EXPECT_NE(m.find("all_gather 'left'"), std::string::npos) << m;
    EXPECT_NE(m.find("all_reduce_sum 'right'"), std::string::npos) << m;
  }
  // The communicator refuses further work; a new one works.
  EXPECT_THROW(comm.barrier("after"), Error);
  Communicator::world().barrier("fresh");
}

TEST(Collectives, ARankThatNeverArrivesIsNamedWhenTheWaitTimesOut) {
  const Communicator comm = Communicator::world();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const double saved = collective_timeout();
  set_collective_timeout(0.5);
  if (comm.rank() == 0) {
    try {
      comm.barrier("lonely");
      FAIL() << "a barrier nobody else entered returned";
    } catch (const Error& e) {
      std::string expected = "rank(s) 1";
      for (int r = 2; r < comm.size(); ++r) expected += ", " + std::to_string(r);
      EXPECT_NE(std::string(e.what()).find(expected + " did not arrive within 0.5 s"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("'lonely'"), std::string::npos) << e.what();
    }
  }
  set_collective_timeout(saved);
  Communicator::world().barrier("after the timeout");
}

TEST(Collectives, BadArgumentsAreRefusedBeforeAnyTransfer) {
  const Communicator comm = Communicator::world();
  const Stream stream = default_device().default_stream();
  const Tensor x = filled({2, 3}, comm.rank(), 8);
  EXPECT_THROW(all_gather(x, 2, comm, stream, "bad"), Error);
  EXPECT_THROW(all_gather(x, 0, comm, stream, "bad", {1}), Error);
  EXPECT_THROW(all_to_all(x, 1, 1, comm, stream, "bad"), Error);
  EXPECT_THROW(all_reduce_sum(Tensor::zeros({2}, DType::bf16), comm, stream, "bad"), Error);
  EXPECT_THROW(send_recv(x, comm.size(), 0, {2, 3}, comm, stream, "bad"), Error);
  EXPECT_THROW(set_collective_timeout(0), Error);
  EXPECT_THROW(set_collective_timeout(std::nan("")), Error);
  comm.barrier("still usable");
}

}  // namespace collectives_mpi_test
}  // namespace cubevec::parallel
