// The step-cache flags of `cubevec t2i` / `t2v` as a user runs them: the stage row and the skipped
// counts in the report and --json, --cache-config files, simulate mode's fixed schedule for data-
// dependent caches, and one-line errors for bad settings.
#include <nlohmann/json.hpp>

#include "cli/run_cubevec.h"

namespace cache_cli_test {  // named after the file: unity batches never mix two files' helpers

using CacheCli = cubevec_cli_test::CliTest;
using cubevec_cli_test::read_file;

const std::string kTinyflux = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";
const std::string kWan14b = std::string(CUBEVEC_SOURCE_DIR) + "/assets/configs/wan2.1-t2v-14b";
const std::string k910b = std::string(CUBEVEC_SOURCE_DIR) + "/assets/devices/ascend-910b.json";

std::vector<std::string> t2i(const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> args = {"t2i",     "--model", kTinyflux, "--prompt", "a red circle on a blue background",
                                   "--steps", "10",      "--out",   out};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

int count_lines(const std::string& text) { return static_cast<int>(std::count(text.begin(), text.end(), '\n')); }

TEST_F(CacheCli, DitBlockCacheReportsWhatItSkipped) {
  const std::string json_path = (dir_ / "r.json").string();
  const auto r = run(t2i((dir_ / "a.jpg").string(), {"--cache", "dit-block", "--cache-step-start", "2", "--cache-interval", "2",
                                                     "--cache-block-start", "1", "--cache-block-end", "3", "--json", json_path}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("cache dit-block"), std::string::npos) << r.err;
  // Steps 3, 5, 7, 9 replay blocks 1 and 2: 2 of 4 blocks skipped in each.
  EXPECT_NE(r.err.find("step 3/10"), std::string::npos);
  EXPECT_NE(r.err.find("skipped 2 of 4 block"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("skipped 8 of 40 block and 0 of 32 attention computations over the run"), std::string::npos) << r.err;
  const auto report = nlohmann::json::parse(read_file(json_path));
  ASSERT_EQ(report["stages"].size(), 1u);
  EXPECT_EQ(report["stages"][0]["name"], "cache dit-block");
  EXPECT_EQ(report["stages"][0]["settings"]["spans_replayed"], 4);
  ASSERT_EQ(report["step_counts"].size(), 10u);
  for (int s = 0; s < 10; ++s) EXPECT_EQ(report["step_counts"][s]["blocks_skipped"], s >= 2 && s % 2 == 1 ? 2 : 0) << s;
}

TEST_F(CacheCli, CacheConfigFileAndFlagsOverIt) {
  const std::string config = (dir_ / "cache.json").string();
  std::ofstream(config) << R"({"cache": "attention", "cache-step-start": 2, "cache-interval": 3})";
  const auto r = run(t2i((dir_ / "a.jpg").string(), {"--cache-config", config}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("cache attention"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("every 3"), std::string::npos) << r.err;
  const auto over = run(t2i((dir_ / "b.jpg").string(), {"--cache-config", config, "--cache-interval", "2"}));
  ASSERT_EQ(over.status, 0) << over.err;
  EXPECT_NE(over.err.find("every 2"), std::string::npos) << over.err;
}

TEST_F(CacheCli, DbCacheWithTaylorSeerRuns) {
  const std::string json_path = (dir_ / "r.json").string();
  const auto r = run(t2i((dir_ / "a.jpg").string(), {"--cache", "db", "--cache-fn", "1", "--cache-threshold", "0.5", "--cache-warmup", "3",
                                                     "--taylorseer", "1", "--json", json_path}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("cache db F1B0 TaylorSeer 1"), std::string::npos) << r.err;
  const auto report = nlohmann::json::parse(read_file(json_path));
  EXPECT_EQ(report["stages"][0]["settings"]["residual_diffs"].size(), 10u);
}

TEST_F(CacheCli, SimulateModelsMindiesWanAttentionCache) {
  const auto plain = run({"t2v", "--simulate", "--model", kWan14b, "--device-profile", k910b, "--dtype", "bf16", "--steps", "50"});
  const auto cached = run({"t2v", "--simulate", "--model", kWan14b, "--device-profile", k910b, "--dtype", "bf16", "--steps", "50",
                           "--cache", "attention", "--cache-step-start", "20", "--cache-interval", "2", "--cache-step-end", "47"});
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(cached.status, 0) << cached.err;
  // Steps 21, 23, ..., 47 (14 of them) replay the self-attention of all 40 blocks.
  EXPECT_NE(cached.err.find("560 attention outputs replayed"), std::string::npos) << cached.err;
  const auto modelled = [](const std::string& err) {
    const auto at = err.find("modelled denoising");
    return std::stod(err.substr(at + 18));
  };
  EXPECT_LT(modelled(cached.err), 0.9 * modelled(plain.err));
  // A data-dependent cache follows a fixed schedule there, and says so.
  const auto db =
      run({"t2v", "--simulate", "--model", kWan14b, "--device-profile", k910b, "--steps", "10", "--cache", "db", "--cache-warmup", "2"});
  ASSERT_EQ(db.status, 0) << db.err;
  EXPECT_NE(db.err.find("simulate: a fixed alternating schedule"), std::string::npos) << db.err;
  EXPECT_NE(db.err.find("[2,4,6,8]"), std::string::npos) << db.err;
}

TEST_F(CacheCli, BadSettingsAreOneLineErrors) {
  const std::string bad_json = (dir_ / "bad.json").string(), unknown = (dir_ / "unknown.json").string();
  std::ofstream(bad_json) << R"({"cache": "db", )";
  std::ofstream(unknown) << R"({"cache": "db", "cache-fn": 1, "speed": "max"})";
  const std::string db_config = (dir_ / "db.json").string();
  std::ofstream(db_config) << R"({"cache": "db", "cache-fn": 1})";
  const struct {
    std::vector<std::string> flags;
    std::string expected;
  } cases[] = {
      {{"--cache", "fast"}, "unknown cache method 'fast' (expected one of: none, attention, dit-block, db)"},
      {{"--cache", "attention", "--cache-interval", "0"}, "--cache-interval must be > 0, got 0"},
      {{"--cache", "attention", "--cache-step-start", "-2"}, "--cache-step-start must be >= 0, got -2"},
      {{"--cache", "dit-block", "--cache-interval", "2", "--cache-block-end", "9"}, "--cache-block-end must be in [0, 4]"},
      {{"--cache", "dit-block", "--cache-interval", "2", "--cache-step-start", "5", "--cache-step-end", "3"},
       "--cache-step-end must be >= --cache-step-start 5, got 3"},
      {{"--cache", "dit-block", "--cache-fn", "2"}, "--cache-fn applies to --cache db, not --cache dit-block"},
      {{"--cache", "db", "--cache-interval", "2"}, "--cache-interval applies to --cache attention and --cache dit-block, not --cache db"},
      {{"--cache", "db", "--cache-fn", "0"}, "--cache-fn must be in [1, 4]"},
      {{"--cache", "db", "--cache-fn", "2", "--cache-bn", "2"}, "--cache-bn must be in [0, 1]"},
      {{"--cache", "db"}, "--cache-fn must be in [1, 4] (blocks computed first; the default is 8), got 8"},
      {{"--cache", "db", "--cache-fn", "1", "--cache-threshold", "-0.5"}, "--cache-threshold must be a finite number >= 0"},
      {{"--cache", "db", "--cache-fn", "1", "--cache-warmup", "11"}, "--cache-warmup must be in [0, 10]"},
      {{"--cache", "db", "--cache-fn", "1", "--taylorseer", "3"}, "--taylorseer must be 1 or 2"},
      {{"--cache-config", bad_json}, bad_json},
      {{"--cache-config", unknown}, "unknown key 'speed' for cache config"},
      {{"--cache-config", (dir_ / "missing.json").string()}, "missing.json"},
      {{"--cache", "attention", "--cache-config", db_config}, "--cache attention contradicts --cache-config"},
  };
  for (const auto& c : cases) {
    const auto r = run(t2i((dir_ / "x.jpg").string(), c.flags));
    EXPECT_EQ(r.status, 1) << c.expected << "\n" << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << "expected '" << c.expected << "', got: " << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir_ / "x.jpg"));
  }
}

}  // namespace cache_cli_test

namespace cache_cli_test {  // named after the file: unity batches never mix two files' helpers

TEST_F(CacheCli, TuneCachePrintsAConfigThatT2iReads) {
  const std::string chosen = (dir_ / "chosen.json").string();
  const auto r = run({"tune-cache", "--model", kTinyflux, "--prompt", "a red circle on a blue background", "--steps", "12",
                      "--target-speedup", "1.15", "--max-trials", "2", "--out", chosen});
  // Whether a setting reaches the target depends on the machine's timing; either outcome is a clean
  // report, and a chosen setting is valid JSON that --cache-config accepts.
  ASSERT_TRUE(r.status == 0 || r.status == 1) << r.err;
  EXPECT_NE(r.err.find("reference (no cache)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("dit-block: blocks ["), std::string::npos) << r.err;
  if (r.status == 1) {
    EXPECT_NE(r.err.find("error: no setting reached"), std::string::npos) << r.err;
    return;
  }
  const auto printed = nlohmann::json::parse(r.out);
  EXPECT_EQ(printed, nlohmann::json::parse(read_file(chosen)));
  const auto t = run(t2i((dir_ / "a.jpg").string(), {"--cache-config", chosen}));
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.err.find("cache " + printed["cache"].get<std::string>()), std::string::npos) << t.err;
}

TEST_F(CacheCli, TuneCacheSaysWhenATargetIsOutOfReach) {
  const auto r = run({"tune-cache", "--model", kTinyflux, "--prompt", "a red circle on a blue background", "--steps", "6",
                      "--target-speedup", "40", "--method", "dit-block"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("note: dit-block: replaying"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("error: no setting reached"), std::string::npos) << r.err;
  const auto bad = run({"tune-cache", "--model", kTinyflux, "--prompt", "a red circle", "--target-speedup", "0.9"});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("--target-speedup must be a finite number above 1"), std::string::npos) << bad.err;
}

}  // namespace cache_cli_test
