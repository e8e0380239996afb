// --packed-cache DIR on t2i and t2v: the first run writes the file, the next maps it and packs none
// of the cached layers (its report says so), and every run draws the picture of a run without the
// cache, in f32 and bf16; a changed file is ignored with a note, a damaged one ends the run with a
// message naming it, and the flag's conflicts are errors before any work.
#include <filesystem>
#include <thread>
#include <vector>
#include <nlohmann/json.hpp>

#include "cli/run_cubevec.h"

namespace packed_cache_cli_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec_cli_test;
using PackedCacheCli = CliTest;
using nlohmann::json;

const std::vector<std::string> kTinyFluxRun = {"t2i",    "--model", kTinyFlux, "--prompt", "a red circle", "--steps", "2",
                                               "--seed", "3",       "--width", "32",       "--height",     "32"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// Overwrites the file in place (the cache keeps it read-only; the test damages it on purpose).
void overwrite(const std::string& path, const std::string& bytes) {
  fs::permissions(path, fs::perms::owner_write, fs::perm_options::add);
  write_text(path, bytes);
}

std::string the_cache_file(const fs::path& dir) {
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".cvpack") return entry.path().string();
  return "";
}

// A copy of the tests' shared tuning file for the runs of one test to share. GEMM keys are measured
// once across processes (the tuning file's lock), but an attention key may be tuned by a test beside
// this one in the same moment: the first to save decides the file's pick, which need not be the pick
// this test's first run used, so on a fresh build two runs of one test could draw pictures a
// rounding apart.
std::string private_tuning_file(const fs::path& dir) {
  const fs::path copy = dir / "tuning.json";
  const char* cache_home = std::getenv("XDG_CACHE_HOME");
  std::error_code ec;
  if (cache_home && *cache_home) fs::copy_file(fs::path(cache_home) / "cubevec" / "tuning.json", copy, ec);  // absent: calibrated here
  return copy.string();
}

TEST_F(PackedCacheCli, TheSecondRunMapsTheFileAndDrawsTheSamePicture) {
  const std::string cache = (dir_ / "cache").string(), tuning = private_tuning_file(dir_);
  for (const std::string dtype : {"f32", "bf16"}) {
    const auto out = [&](const char* name) { return (dir_ / (dtype + name)).string(); };
    const auto t2i = with(kTinyFluxRun, {"--dtype", dtype, "--tune-cache", tuning});
    const Process plain = run(with(t2i, {"--out", out("plain.png"), "--json", out("plain.json")}));
    ASSERT_EQ(plain.status, 0) << plain.err;
    const Process first = run(with(t2i, {"--out", out("first.png"), "--json", out("first.json"), "--packed-cache", cache}));
    ASSERT_EQ(first.status, 0) << first.err;
    EXPECT_NE(first.err.find("t2i: packed cache: written " + cache + "/tinyflux-"), std::string::npos) << first.err;
    const Process second = run(with(t2i, {"--out", out("second.png"), "--json", out("second.json"), "--packed-cache", cache}));
    ASSERT_EQ(second.status, 0) << second.err;
    EXPECT_NE(second.err.find("t2i: packed cache: mapped " + cache + "/tinyflux-"), std::string::npos) << second.err;

    const json plain_report = json::parse(read_file(out("plain.json"))), first_report = json::parse(read_file(out("first.json"))),
               second_report = json::parse(read_file(out("second.json")));
    EXPECT_FALSE(plain_report.contains("packed_cache"));
    EXPECT_EQ(first_report["packed_cache"]["state"], "written");
    EXPECT_EQ(second_report["packed_cache"]["state"], "mapped");
    EXPECT_EQ(second_report["packed_cache"]["packed"], 0);
    EXPECT_GT(second_report["packed_cache"]["layers"].get<int>(), 10);
    EXPECT_EQ(second_report["packed_cache"]["bytes"], first_report["packed_cache"]["bytes"]);
    // Only the text encoder (not cached: loaded for the prompt and freed) packs in the mapped run.
    EXPECT_LT(second_report["gemm_panels_packed"].get<int>(), plain_report["gemm_panels_packed"].get<int>());
    EXPECT_EQ(read_file(out("first.png")), read_file(out("plain.png"))) << dtype;
    EXPECT_EQ(read_file(out("second.png")), read_file(out("plain.png"))) << dtype;
  }
  int files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(cache)) ++files;
  EXPECT_EQ(files, 2) << "f32 and bf16 loads keep a file each";
}

TEST_F(PackedCacheCli, VideoRunsMapTheCacheToo) {
  const std::string cache = (dir_ / "cache").string();
  const std::vector<std::string> t2v = {
      "t2v", "--model",  kTinyWan, "--prompt",     "a red circle",           "--steps", "2", "--seed", "3", "--width", "32", "--height",
      "32",  "--frames", "17",     "--tune-cache", private_tuning_file(dir_)};
  const Process plain = run(with(t2v, {"--out", (dir_ / "plain.avi").string()}));
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(run(with(t2v, {"--out", (dir_ / "first.avi").string(), "--packed-cache", cache})).status, 0);
  const Process second = run(with(t2v, {"--out", (dir_ / "second.avi").string(), "--packed-cache", cache}));
  ASSERT_EQ(second.status, 0) << second.err;
  EXPECT_NE(second.err.find("t2v: packed cache: mapped " + cache + "/tinywan-"), std::string::npos) << second.err;
  EXPECT_EQ(read_file((dir_ / "second.avi").string()), read_file((dir_ / "plain.avi").string()));
}

TEST_F(PackedCacheCli, AChangedFileIsReplacedAndADamagedOneIsAnErrorNamingIt) {
  const std::string cache = (dir_ / "cache").string(), png = (dir_ / "a.png").string();
  const auto t2i = with(kTinyFluxRun, {"--tune-cache", private_tuning_file(dir_)});
  ASSERT_EQ(run(with(t2i, {"--out", png, "--packed-cache", cache})).status, 0);
  const std::string file = the_cache_file(cache);
  ASSERT_FALSE(file.empty());
  const std::string good = read_file(file);

  std::string other_cpu = good;
  const std::size_t cpu_at = other_cpu.find("\"cpu\":\"");
  ASSERT_NE(cpu_at, std::string::npos);
  other_cpu[cpu_at + 7] = other_cpu[cpu_at + 7] == 'X' ? 'Y' : 'X';
  overwrite(file, other_cpu);
  const Process foreign = run(with(t2i, {"--out", (dir_ / "b.png").string(), "--packed-cache", cache}));
  ASSERT_EQ(foreign.status, 0) << foreign.err;
  EXPECT_NE(foreign.err.find("packed cache: " + file + " was made for another CPU"), std::string::npos) << foreign.err;
  EXPECT_NE(foreign.err.find("packed cache: written " + file), std::string::npos) << foreign.err;
  EXPECT_EQ(read_file(file), good) << "rewritten as this CPU writes it";
  EXPECT_EQ(read_file((dir_ / "b.png").string()), read_file(png));

  overwrite(file, good.substr(0, good.size() / 2));
  const Process truncated = run(with(t2i, {"--out", (dir_ / "c.png").string(), "--packed-cache", cache}));
  EXPECT_EQ(truncated.status, 1);
  EXPECT_NE(truncated.err.find("--packed-cache file " + file + " is damaged"), std::string::npos) << truncated.err;
  EXPECT_FALSE(fs::exists(dir_ / "c.png")) << "no picture from a damaged cache";
  EXPECT_EQ(read_file(file), good.substr(0, good.size() / 2)) << "a damaged file is left for the user to look at";
}

// Processes started together on one new cache folder race to write its file: the first to finish
// renames it into place and the others map it (before, a late writer failed, "it appeared during the
// run": 3 of 20 such loads in a probe).
TEST_F(PackedCacheCli, ProcessesStartedTogetherShareOneNewFile) {
  for (int round = 0; round < 2; ++round) {
    const std::string cache = (dir_ / ("cache" + std::to_string(round))).string();
    std::vector<Process> results(4);
    std::vector<std::thread> threads;
    for (std::size_t i = 0; i < results.size(); ++i) {
      const fs::path scratch = dir_ / ("run" + std::to_string(round) + "_" + std::to_string(i));
      fs::create_directories(scratch);
      threads.emplace_back([&results, i, scratch, cache] {
        results[i] = run_cubevec(with(kTinyFluxRun, {"--packed-cache", cache, "--out", (scratch / "x.png").string()}), scratch);
      });
    }
    for (std::thread& t : threads) t.join();
    for (const Process& r : results) EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(the_cache_file(cache), "");
  }
}

TEST_F(PackedCacheCli, ConflictingFlagsAreErrorsBeforeAnyWork) {
  const std::string cache = (dir_ / "cache").string(), png = (dir_ / "a.png").string();
  const Process offload = run(with(kTinyFluxRun, {"--out", png, "--packed-cache", cache, "--offload", "1"}));
  EXPECT_EQ(offload.status, 1);
  EXPECT_NE(offload.err.find("does not combine with --offload"), std::string::npos) << offload.err;
  const Process simulate = run(with(kTinyFluxRun, {"--simulate", "--packed-cache", cache}));
  EXPECT_EQ(simulate.status, 1);
  EXPECT_NE(simulate.err.find("--packed-cache has nothing to map under --simulate"), std::string::npos) << simulate.err;
  write_text(dir_ / "file", "x");
  const Process not_a_folder = run(with(kTinyFluxRun, {"--out", png, "--packed-cache", (dir_ / "file").string()}));
  EXPECT_EQ(not_a_folder.status, 1);
  EXPECT_NE(not_a_folder.err.find((dir_ / "file").string() + " is not a folder"), std::string::npos) << not_a_folder.err;
  const Process empty = run(with(kTinyFluxRun, {"--out", png, "--packed-cache", ""}));
  EXPECT_EQ(empty.status, 1);
  EXPECT_NE(empty.err.find("--packed-cache: expected a folder, got an empty path"), std::string::npos) << empty.err;
  EXPECT_FALSE(fs::exists(cache));
  EXPECT_FALSE(fs::exists(png));
}

}  // namespace packed_cache_cli_test
