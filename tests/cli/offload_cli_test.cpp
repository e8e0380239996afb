// --offload R on t2i and t2v (issue 19): the output is byte-identical to the resident run's, the
// stage row and the --json report say what was streamed, and an R the model cannot honour is an
// error before any work.
#include <nlohmann/json.hpp>

#include "cli/run_cubevec.h"
#include "cli/tiny_prompt_embeds.h"

namespace offload_cli_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;
using OffloadCli = cubevec_cli_test::CliTest;
using cubevec_cli_test::flux_embeds;
using cubevec_cli_test::read_file;
using cubevec_cli_test::wan_embeds;

using cubevec_cli_test::kFlux;
using cubevec_cli_test::kWan;

TEST_F(OffloadCli, T2IWithOffloadWritesTheSameJpeg) {
  const std::string embeds = flux_embeds(dir_);
  for (const char* dtype : {"f32", "bf16"}) {
    const std::vector<std::string> base = {"t2i", "--model", kFlux, "--prompt-embeds", embeds, "--width", "32", "--height",
                                           "32",  "--steps", "2",   "--dtype",         dtype};
    auto with = [&](std::vector<std::string> extra) {
      std::vector<std::string> args = base;
      args.insert(args.end(), extra.begin(), extra.end());
      return run(args);
    };
    const auto resident = with({"--out", (dir_ / "a.jpg").string()});
    ASSERT_EQ(resident.status, 0) << resident.err;
    const std::string json = (dir_ / "r.json").string();
    const auto streamed = with({"--out", (dir_ / "b.jpg").string(), "--offload", "1", "--json", json});
    ASSERT_EQ(streamed.status, 0) << streamed.err;
    EXPECT_EQ(read_file((dir_ / "a.jpg").string()), read_file((dir_ / "b.jpg").string())) << dtype;
    EXPECT_NE(streamed.err.find("offload"), std::string::npos) << streamed.err;
    EXPECT_NE(streamed.err.find("block 0 resident"), std::string::npos) << streamed.err;
    const nlohmann::json report = nlohmann::json::parse(read_file(json));
    bool found = false;
    for (const auto& stage : report["stages"])
      if (stage["name"] == "offload") {
        found = true;
        EXPECT_EQ(stage["settings"]["resident_blocks"], 1);
        EXPECT_GT(stage["settings"]["prefetches"].get<int>(), 0);
      }
    EXPECT_TRUE(found) << report.dump();
  }
}

TEST_F(OffloadCli, T2VWithOffloadWritesTheSameVideo) {
  const std::string embeds = wan_embeds(dir_);
  const std::vector<std::string> base = {"t2v", "--model",  kWan, "--prompt-embeds", embeds, "--width", "64", "--height",
                                         "64",  "--frames", "5",  "--steps",         "2"};
  std::vector<std::string> a = base, b = base;
  a.insert(a.end(), {"--out", (dir_ / "a.avi").string()});
  b.insert(b.end(), {"--out", (dir_ / "b.avi").string(), "--offload", "1"});
  const auto resident = run(a), streamed = run(b);
  ASSERT_EQ(resident.status, 0) << resident.err;
  ASSERT_EQ(streamed.status, 0) << streamed.err;
  EXPECT_EQ(read_file((dir_ / "a.avi").string()), read_file((dir_ / "b.avi").string()));
}

TEST_F(OffloadCli, AnROutsideTheModelIsRefusedBeforeAnyWork) {
  const std::string embeds = flux_embeds(dir_);
  for (const char* r : {"4", "1000"}) {
    const auto bad = run({"t2i", "--model", kFlux, "--prompt-embeds", embeds, "--width", "32", "--height", "32", "--steps", "1",
                          "--offload", r, "--out", (dir_ / "x.jpg").string()});
    EXPECT_EQ(bad.status, 1);
    EXPECT_NE(bad.err.find(std::string("error: --offload ") + r + ": the resident blocks must number 1 to 3 (the model has 4 blocks"),
              std::string::npos)
        << bad.err;
    EXPECT_EQ(bad.err.find("t2i:"), std::string::npos) << bad.err;  // no run header: nothing ran
    EXPECT_FALSE(fs::exists(dir_ / "x.jpg"));
  }
  for (const char* r : {"-1", "x", "1.5"}) {
    const auto bad = run({"t2i", "--model", kFlux, "--prompt-embeds", embeds, "--offload", r, "--out", (dir_ / "x.jpg").string()});
    EXPECT_EQ(bad.status, 1) << r;
    EXPECT_NE(bad.err.find("--offload"), std::string::npos) << bad.err;
  }
}

}  // namespace offload_cli_test
