#include "pipelines/cv_experiment.h"

#include <gtest/gtest.h>

namespace cubevec {
namespace cv_experiment_test {  // named after the file: unity batches never mix two files' helpers

TEST(CvExperiment, IntervalArithmetic) {
  EXPECT_DOUBLE_EQ(busy_time({{0, 2}, {1, 3}, {5, 6}}), 4.0);
  EXPECT_DOUBLE_EQ(busy_time({}), 0.0);
  EXPECT_DOUBLE_EQ(overlap_time({{0, 4}, {6, 8}}, {{3, 7}}), 2.0);  // [3,4] and [6,7]
  EXPECT_DOUBLE_EQ(overlap_time({{0, 1}}, {{1, 2}}), 0.0);
  EXPECT_DOUBLE_EQ(overlap_time({{0, 10}}, {{1, 2}, {2, 3}, {9, 12}}), 3.0);
}

TEST(CvExperiment, EveryModeComputesTheSameResults) {
  const CvWorkload small{.chunks = 3, .m = 16, .n = 32, .k = 24};
  DeviceProfile profile = builtin_cpu_profile();
  profile.launch_overhead_us = 0;
  std::vector<CvResult> results;
  for (CvMode mode : kAllCvModes) results.push_back(run_cv_experiment(small, mode, profile, 2));
  for (const CvResult& r : results) {
    EXPECT_EQ(r.checksum, results[0].checksum) << cv_mode_name(r.mode);
    ASSERT_EQ(r.checksum.size(), 3u);
    // softmax rows sum to 1: each chunk's checksum is its row count M.
    for (float c : r.checksum) EXPECT_NEAR(c, 16.0f, 1e-3f);
    EXPECT_EQ(r.records.size(), 3u * 4u) << "a GEMM and three vector kernels per chunk";
    EXPECT_EQ(r.walls_s.size(), 2u);
    EXPECT_GT(r.wall_s, 0);
  }
  // On the modelled NPU, overlapping can only help, and cannot beat the busier unit.
  EXPECT_LT(results[1].modelled_s, results[0].modelled_s);
  EXPECT_DOUBLE_EQ(results[1].modelled_s, results[2].modelled_s);
}

TEST(CvExperiment, RejectsEmptyWorkloads) {
  EXPECT_THROW(run_cv_experiment({.chunks = 0}, CvMode::serialized, builtin_cpu_profile(), 1), Error);
  EXPECT_THROW(run_cv_experiment({}, CvMode::serialized, builtin_cpu_profile(), 0), Error);
}

}  // namespace cv_experiment_test
}  // namespace cubevec
