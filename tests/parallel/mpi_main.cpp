// The multi-rank suite's main: every rank runs every test (the tests are SPMD), under mpirun.
// Rank 0 prints GoogleTest's usual report; the other ranks print only their failures, prefixed
// with their rank, so a failure on any rank is visible and fails the run.
#include <gtest/gtest.h>

#include <cstdio>

#include "parallel/mpi_runtime.h"

namespace mpi_main {  // named after the file: unity batches never mix two files' helpers

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }

 private:
  int rank_;
};

}  // namespace mpi_main

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (cubevec::parallel::launched_by_mpirun()) cubevec::parallel::ensure_mpi();
  const int rank = cubevec::parallel::world_rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new mpi_main::RankFailurePrinter(rank));
  }
  const int status = RUN_ALL_TESTS();
  cubevec::parallel::finalize(status);
  return status;
}
