// `cubevec cv-experiment` as a user runs it: the table, --json and --trace files, and bad flags.
#include <nlohmann/json.hpp>

#include "cli/run_cubevec.h"

namespace cv_experiment_cli_test {  // named after the file: unity batches never mix two files' helpers

using CvExperimentCli = cubevec_cli_test::CliTest;
using cubevec_cli_test::read_file;

TEST_F(CvExperimentCli, PrintsATableAndWritesJsonAndTrace) {
  const std::string json_path = (dir_ / "cv.json").string(), trace_path = (dir_ / "cv-trace.json").string();
  const auto run_result = run({"cv-experiment", "--chunks", "2", "--m", "8", "--n", "16", "--k", "8", "--repeats", "1", "--json", json_path,
                               "--trace", trace_path, "--device-profile", CUBEVEC_SOURCE_DIR "/assets/devices/ascend-910b.json"});
  ASSERT_EQ(run_result.status, 0) << run_result.err;
  for (const char* mode : {"serialized", "overlapped", "pinned"})
    EXPECT_NE(run_result.err.find(std::string("\n") + mode + " "), std::string::npos) << mode << " row missing:\n" << run_result.err;
  EXPECT_NE(run_result.err.find("profile ascend-910b"), std::string::npos);
  const auto report = nlohmann::json::parse(read_file(json_path));
  ASSERT_EQ(report["modes"].size(), 3u);
  EXPECT_EQ(report["modes"][0]["mode"], "serialized");
  EXPECT_DOUBLE_EQ(report["modes"][0]["speedup_vs_serialized"].get<double>(), 1.0);
  EXPECT_GT(report["modes"][1]["modelled_s"].get<double>(), 0.0);
  const auto trace = nlohmann::json::parse(read_file(trace_path));
  int slices = 0;
  for (const auto& e : trace["traceEvents"]) slices += e["ph"] == "X";
  EXPECT_EQ(slices, 3 * 2 * 4 * 4) << "3 modes x 2 chunks x 4 kernels, each on 4 tracks";
}

TEST_F(CvExperimentCli, BadFlagsAreOneLineErrors) {
  for (const std::vector<std::string>& args : {std::vector<std::string>{"cv-experiment", "--chunks", "0"},
                                               {"cv-experiment", "--m", "ten"},
                                               {"cv-experiment", "--device-profile", "/nonexistent.json"},
                                               {"cv-experiment", "--cube-threads", "0"}}) {
    const auto r = run(args);
    EXPECT_EQ(r.status, 1) << args.back() << ": " << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

}  // namespace cv_experiment_cli_test
