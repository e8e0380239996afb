// A rank whose work fails makes every other rank stop with an error naming it, instead of waiting
// in the next collective. Run on its own (the failure notice is once per process, so it would
// stop every later test of the same run).
#include <gtest/gtest.h>

#include <string>

#include "device/device.h"
#include "parallel/collectives.h"
#include "parallel/mpi_runtime.h"

namespace cubevec::parallel {
namespace rank_failure_mpi_test {  // named after the file: unity batches never mix two files' helpers

TEST(RankFailure, AFailingRankStopsTheOthersWithItsMessage) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  set_collective_timeout(60);  // far below ctest's limit: a missed notice fails here, with a message
  const Stream stream = default_device().default_stream();
  const Tensor x = Tensor::zeros({8}, DType::f32);
  if (world_rank() == 1) {
    // Rank 1's own work fails (a kernel throws); like the CLI, it tells the others and stops.
    stream.launch({"failing_kernel", Unit::vector}, {}, {}, [] { throw Error("the input on rank 1 was bad"); });
    try {
      stream.synchronize();
      FAIL() << "the failing kernel did not fail";
    } catch (const Error& e) {
      announce_failure(e.what());
    }
    return;
  }
  // The others go on to collectives rank 1 never reaches; they must stop with its message, in
  // whichever operation they are when it arrives, not wait for the timeout.
  try {
    const Communicator comm = Communicator::world();
    comm.barrier("start");
    all_gather(x, 0, comm, stream, "next.step");
    stream.synchronize();
    FAIL() << "the collectives completed without rank 1";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(" on communicator 'world' (rank " + std::to_string(world_rank())), std::string::npos) << m;
    EXPECT_NE(m.find("stopped: rank 1 failed:"), std::string::npos) << m;
    EXPECT_NE(m.find("the input on rank 1 was bad"), std::string::npos) << m;
  }
}

}  // namespace rank_failure_mpi_test
}  // namespace cubevec::parallel
