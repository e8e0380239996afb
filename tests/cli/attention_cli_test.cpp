// `cubevec attention` as a user runs it: the autotuner's pick persisted by --attn-tune-cache (tuned
// once, then a cache hit), stale and malformed cache files, --json, and bad flags.
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/run_cubevec.h"
#include "device/device_profile.h"
#include "ops/attention.h"

namespace attention_cli_test {  // named after the file: unity batches never mix two files' helpers

using AttentionCli = cubevec_cli_test::CliTest;
using cubevec_cli_test::read_file;

const std::vector<std::string> kSmall = {"attention", "--q-len",    "40", "--kv-len",  "70", "--heads",
                                         "2",         "--head-dim", "24", "--repeats", "1"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST_F(AttentionCli, TuneCacheIsWrittenThenUsed) {
  const std::string cache = (dir_ / "tune.json").string(), json_path = (dir_ / "report.json").string();
  const auto first = run(with(kSmall, {"--attn-tune-cache", cache}));
  ASSERT_EQ(first.status, 0) << first.err;
  EXPECT_NE(first.err.find("does not exist yet"), std::string::npos) << first.err;
  EXPECT_NE(first.err.find("tuned on the first call"), std::string::npos) << first.err;
  const auto written = nlohmann::json::parse(read_file(cache));
  ASSERT_EQ(written["entries"].size(), 1u);
  EXPECT_EQ(written["entries"][0]["q_len"], 40);
  EXPECT_EQ(written["entries"][0]["kv_len"], 70);

  const auto second = run(with(kSmall, {"--attn-tune-cache", cache, "--json", json_path}));
  ASSERT_EQ(second.status, 0) << second.err;
  EXPECT_NE(second.err.find("attention tune cache: 1 entries"), std::string::npos) << second.err;
  EXPECT_NE(second.err.find("tune cache hit"), std::string::npos) << second.err;
  const auto report = nlohmann::json::parse(read_file(json_path));
  EXPECT_EQ(report["tune_cache_hit"], true);
  EXPECT_EQ(report["implementation"],
            std::string(written["entries"][0]["op_type"]) + "/" + std::string(written["entries"][0]["kernel_layout"]));
  EXPECT_GT(report["gflops"].get<double>(), 0.0);

  // A read-only cache that needs no update is read and left alone; one that needs an update but
  // cannot be written is a warning after a successful run.
  const std::string before = read_file(cache);
  std::filesystem::permissions(cache, std::filesystem::perms::owner_read);
  const std::string other_threads = std::to_string(cubevec::machine_unit_threads() + 1);  // never the default's
  const auto readonly = run(with(kSmall, {"--attn-tune-cache", cache}));
  ASSERT_EQ(readonly.status, 0) << readonly.err;
  EXPECT_EQ(readonly.err.find("warning"), std::string::npos) << readonly.err;
  EXPECT_EQ(read_file(cache), before);
  const auto unsaved = run(with(kSmall, {"--attn-tune-cache", cache, "--cube-threads", other_threads}));
  ASSERT_EQ(unsaved.status, 0) << unsaved.err;
  EXPECT_NE(unsaved.err.find("warning: the attention tune cache was not saved: attention tune cache " + cache + ": is read-only"),
            std::string::npos)
      << unsaved.err;
  EXPECT_EQ(read_file(cache), before);
  std::filesystem::permissions(cache, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);

  // Tuned for other thread counts: a warning, tuned again, the file rewritten for this device.
  const auto stale = run(with(kSmall, {"--attn-tune-cache", cache, "--cube-threads", other_threads}));
  ASSERT_EQ(stale.status, 0) << stale.err;
  EXPECT_NE(stale.err.find("warning: attention tune cache " + cache + " is stale"), std::string::npos) << stale.err;
  EXPECT_NE(stale.err.find("tuned on the first call"), std::string::npos) << stale.err;
  EXPECT_NE(read_file(cache).find("cube_threads=" + other_threads), std::string::npos);
}

TEST_F(AttentionCli, MalformedCacheAndBadFlagsAreOneLineErrors) {
  const std::string cache = (dir_ / "bad.json").string();
  std::ofstream(cache) << "{\"format\": \"cubevec-attention-tune-cache\", \"version\": 1, \"entries\": 3}";
  for (const auto& args : {with(kSmall, {"--attn-tune-cache", cache}), with(kSmall, {"--opt-mode", "auto"}),
                           with(kSmall, {"--opt-mode", "manual", "--op-type", "laser"}), with(kSmall, {"--dtype", "f16"}),
                           with(kSmall, {"--layout", "BSH", "--heads", "5", "--head-dim", "0"})}) {
    const auto r = run(args);
    EXPECT_EQ(r.status, 1) << args.back() << ": " << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  const std::pair<std::vector<std::string>, std::string> named[] = {
      {{"--layout", "junk"}, "error: --layout: unknown attention layout 'junk'"},
      {{"--opt-mode", "manual", "--kernel-layout", "junk"}, "error: --kernel-layout: unknown attention layout 'junk'"},
      {{"--opt-mode", "junk"}, "error: --opt-mode: unknown attention opt_mode 'junk'"},
      {{"--opt-mode", "manual", "--op-type", "flash_fp8"}, "error: --op-type: unknown attention op_type 'flash_fp8'"}};
  for (const auto& [args, message] : named) {
    const auto bad = run(with(kSmall, args));
    EXPECT_NE(bad.err.find(message), std::string::npos) << bad.err;
  }
  for (const char* dtype : {"f16", "BF16", "int8"}) {  // only the two it takes are named
    const auto bad = run(with(kSmall, {"--dtype", dtype}));
    EXPECT_NE(bad.err.find(std::string("--dtype must be f32 or bf16, got '") + dtype + "'"), std::string::npos) << bad.err;
  }
  const auto r = run(with(kSmall, {"--attn-tune-cache", cache}));
  EXPECT_NE(r.err.find("attention tune cache " + cache + " is not valid: field 'fingerprint' must be a string"), std::string::npos)
      << r.err;
  // A kernel named outside manual mode would be ignored for the tuner's pick: an error instead.
  const auto ignored = run(with(kSmall, {"--op-type", "flash_int8"}));
  EXPECT_NE(ignored.err.find("--op-type applies with --opt-mode manual (got --opt-mode runtime)"), std::string::npos) << ignored.err;
  const auto layout = run(with(kSmall, {"--opt-mode", "static", "--kernel-layout", "BSND"}));
  EXPECT_NE(layout.err.find("--kernel-layout applies with --opt-mode manual (got --opt-mode static)"), std::string::npos) << layout.err;
}

TEST_F(AttentionCli, ManualModeRunsTheNamedImplementation) {
  const auto r = run(with(kSmall, {"--opt-mode", "manual", "--op-type", "cv_pipelined", "--kernel-layout", "BSND", "--dtype", "bf16"}));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("implementation  cv_pipelined/BSND"), std::string::npos) << r.out;
  // Static mode names what its table runs (flash_bf16 for bf16 on an AMX CPU), and only runtime
  // mode reports a tune-cache hit.
  const std::string json_path = (dir_ / "static.json").string();
  const auto fixed = run(with(kSmall, {"--opt-mode", "static", "--dtype", "bf16", "--json", json_path}));
  ASSERT_EQ(fixed.status, 0) << fixed.err;
  const std::string want = std::string(cubevec::ops::attention_impl_name(cubevec::ops::attention_static_impl(cubevec::DType::bf16)));
  EXPECT_NE(fixed.out.find("implementation  " + want + "/"), std::string::npos) << fixed.out;
  EXPECT_EQ(nlohmann::json::parse(read_file(json_path))["tune_cache_hit"], false);
}

}  // namespace attention_cli_test
