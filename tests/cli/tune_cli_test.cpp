// `cubevec tune` and --tune-cache (issue 19): the tuning file is filled with a progress bar, kept on
// a second run, refused clearly when malformed or not a regular file, and written by a generation
// run that had to calibrate (GEMM variants and attention picks alike), which the next run reuses.
#include <sys/stat.h>

#include <future>
#include <set>

#include <nlohmann/json.hpp>

#include "cli/run_cubevec.h"
#include "cli/tiny_prompt_embeds.h"
#include "ops/gemm/tuner.h"

namespace tune_cli_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;
using TuneCli = cubevec_cli_test::CliTest;
using cubevec_cli_test::read_file;

using cubevec_cli_test::kFlux;

TEST_F(TuneCli, FillsTheTuningFileWithAProgressBarAndKeepsItOnASecondRun) {
  const std::string file = (dir_ / "tuning.json").string();
  const auto first = run({"tune", "--tune-cache", file, "--families", "f32", "--shapes", "skinny", "--cube-threads", "1"});
  ASSERT_EQ(first.status, 0) << first.err;
  const std::size_t variants =
      cubevec::ops::gemm::candidate_variants(cubevec::ops::gemm::GemmFamily::f32, cubevec::ops::gemm::best_isa()).size();
  const std::string full_bar = "[########################] " + std::to_string(variants) + "/" + std::to_string(variants);
  EXPECT_NE(first.err.find(full_bar), std::string::npos) << first.err;
  EXPECT_NE(first.out.find("f32"), std::string::npos) << first.out;
  const nlohmann::json doc = nlohmann::json::parse(read_file(file));
  EXPECT_EQ(doc["format"], "cubevec-tuning");
  ASSERT_EQ(doc["gemm"].size(), 1u);
  EXPECT_EQ(doc["gemm"][0]["family"], "f32");
  EXPECT_EQ(doc["gemm"][0]["shape"], "skinny");
  EXPECT_EQ(doc["gemm"][0]["threads"], 1);
  EXPECT_EQ(doc["gemm"][0]["considered"].size(), variants);

  const std::string before = read_file(file);
  const auto second = run({"tune", "--tune-cache", file, "--families", "f32", "--shapes", "skinny", "--cube-threads", "1"});
  ASSERT_EQ(second.status, 0) << second.err;
  EXPECT_NE(second.err.find("already in the tuning file"), std::string::npos) << second.err;
  EXPECT_EQ(read_file(file), before);
}

// Two tunes started together on one file take turns per key (the tuning file's lock): each key is
// measured once, by whichever process got there first, and the other finds it in the file.
TEST_F(TuneCli, TwoTunesStartedTogetherMeasureEachKeyOnce) {
  const std::string file = (dir_ / "cache" / "tuning.json").string();
  fs::create_directories(dir_ / "cache");
  const std::vector<std::string> args{"tune", "--tune-cache", file, "--families", "f32", "--shapes", "skinny", "--cube-threads", "2"};
  fs::create_directories(dir_ / "other");  // its own stdout and stderr files
  auto other = std::async(std::launch::async, [&] { return cubevec_cli_test::run_cubevec(args, dir_ / "other"); });
  const auto mine = run(args);
  const auto theirs = other.get();
  ASSERT_EQ(mine.status, 0) << mine.err;
  ASSERT_EQ(theirs.status, 0) << theirs.err;
  const nlohmann::json doc = nlohmann::json::parse(read_file(file));
  ASSERT_EQ(doc["gemm"].size(), 2u) << doc.dump();  // 1 and 2 threads, neither save dropped the other's
  auto found = [](const std::string& err) {
    std::size_t n = 0;
    for (std::size_t at = err.find("already in the tuning file"); at != std::string::npos;
         at = err.find("already in the tuning file", at + 1))
      ++n;
    return n;
  };
  EXPECT_EQ(found(mine.err) + found(theirs.err), 2u) << "each key measured by one process only\n" << mine.err << "\n" << theirs.err;
}

TEST_F(TuneCli, BadNamesAndBadFilesAreErrorsBeforeAnyMeasurement) {
  const auto family = run({"tune", "--tune-cache", (dir_ / "t.json").string(), "--families", "f16"});
  EXPECT_EQ(family.status, 1);
  EXPECT_NE(family.err.find("--families: unknown name 'f16' (expected one of: f32, bf16, int8)"), std::string::npos) << family.err;
  EXPECT_FALSE(fs::exists(dir_ / "t.json"));

  const std::string malformed = (dir_ / "bad.json").string();
  std::ofstream(malformed) << "{\"format\": \"cubevec-tuning\", \"version\": 1, \"gemm\": [{\"cpu\": 3}]}";
  const auto bad = run({"tune", "--tune-cache", malformed, "--shapes", "skinny"});
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.err.find("error: tuning file " + malformed + " is not valid: gemm entry 0: field 'cpu' must be a string"),
            std::string::npos)
      << bad.err;
  EXPECT_EQ(read_file(malformed), "{\"format\": \"cubevec-tuning\", \"version\": 1, \"gemm\": [{\"cpu\": 3}]}");

  const auto empty = run({"tune", "--tune-cache", "", "--shapes", "skinny"});
  EXPECT_EQ(empty.status, 1);
  EXPECT_NE(empty.err.find("--tune-cache"), std::string::npos) << empty.err;
  EXPECT_NE(empty.err.find("expected a file path, got an empty string"), std::string::npos) << empty.err;

  // A named file's attention section must be valid too (an error naming it, the file untouched).
  const std::string bad_attention = (dir_ / "bad_attention.json").string();
  const std::string bad_text = R"({"format": "cubevec-tuning", "version": 1, "gemm": [], "attention": {"a": 1}})";
  std::ofstream(bad_attention) << bad_text;
  const auto attention = run(
      {"attention", "--batch", "1", "--heads", "2", "--head-dim", "16", "--q-len", "32", "--repeats", "1", "--tune-cache", bad_attention});
  EXPECT_EQ(attention.status, 1);
  EXPECT_NE(attention.err.find("error: tuning file " + bad_attention + " is not valid: field 'attention' must be an array"),
            std::string::npos)
      << attention.err;
  EXPECT_EQ(read_file(bad_attention), bad_text);
  // ... for `tune` too, which writes the file whole: refused before measuring anything.
  const auto tune_bad_attention = run({"tune", "--tune-cache", bad_attention, "--families", "f32", "--shapes", "skinny"});
  EXPECT_EQ(tune_bad_attention.status, 1);
  EXPECT_NE(tune_bad_attention.err.find("error: tuning file " + bad_attention + " is not valid: field 'attention' must be an array"),
            std::string::npos)
      << tune_bad_attention.err;
  EXPECT_EQ(tune_bad_attention.err.find("f32 "), std::string::npos) << "measured before refusing: " << tune_bad_attention.err;
  EXPECT_EQ(read_file(bad_attention), bad_text);

  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto pipe = run({"tune", "--tune-cache", fifo});
  EXPECT_EQ(pipe.status, 1);
  EXPECT_NE(pipe.err.find("--tune-cache " + fifo), std::string::npos) << pipe.err;

  const auto missing_dir = run({"inspect", kFlux, "--tune-cache", (dir_ / "no" / "t.json").string()});
  EXPECT_EQ(missing_dir.status, 1);
  EXPECT_NE(missing_dir.err.find("does not exist"), std::string::npos) << missing_dir.err;
}

TEST_F(TuneCli, AGenerationRunWritesWhatItCalibrated) {
  const std::string file = (dir_ / "tuning.json").string(), embeds = cubevec_cli_test::flux_embeds(dir_);
  const auto t2i = run({"t2i", "--model", kFlux, "--prompt-embeds", embeds, "--steps", "1", "--width", "32", "--height", "32", "--out",
                        (dir_ / "x.jpg").string(), "--tune-cache", file});
  ASSERT_EQ(t2i.status, 0) << t2i.err;
  const nlohmann::json doc = nlohmann::json::parse(read_file(file));
  ASSERT_GE(doc["gemm"].size(), 1u);
  for (const auto& e : doc["gemm"]) EXPECT_EQ(e["family"], "f32") << e.dump();
  // The attention autotuner's picks share the file (one section each, each entry with the device
  // fingerprint it was tuned under).
  ASSERT_TRUE(doc.contains("attention")) << doc.dump();
  ASSERT_GE(doc["attention"].size(), 1u);
  for (const auto& e : doc["attention"]) EXPECT_TRUE(e.contains("fingerprint")) << e.dump();
  // A second run finds everything it needs there: nothing is measured, the file is not rewritten.
  const std::string before = read_file(file);
  const auto again = run({"t2i", "--model", kFlux, "--prompt-embeds", embeds, "--steps", "1", "--width", "32", "--height", "32", "--out",
                          (dir_ / "y.jpg").string(), "--tune-cache", file});
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(read_file(file), before);

  // A read-only tuning file is used as it is: a run that finds what it needs there goes ahead with
  // a note, and `tune`, which exists to write it, is refused naming it.
  ASSERT_EQ(::chmod(file.c_str(), 0444), 0);
  const auto read_only = run({"t2i", "--model", kFlux, "--prompt-embeds", embeds, "--steps", "1", "--width", "32", "--height", "32",
                              "--out", (dir_ / "z.jpg").string(), "--tune-cache", file});
  ASSERT_EQ(read_only.status, 0) << read_only.err;
  EXPECT_NE(read_only.err.find("note: --tune-cache " + file + " is read-only"), std::string::npos) << read_only.err;
  EXPECT_EQ(read_only.err.find("warning"), std::string::npos) << read_only.err;
  const auto tune = run({"tune", "--tune-cache", file, "--families", "f32", "--shapes", "skinny", "--cube-threads", "1", "--again"});
  EXPECT_EQ(tune.status, 1);
  EXPECT_NE(tune.err.find("error: tuning file " + file + ": is read-only"), std::string::npos) << tune.err;
  EXPECT_EQ(tune.err.find("note:"), std::string::npos) << "the read-only note is for commands that use the file: " << tune.err;
  EXPECT_EQ(read_file(file), before);
}

// CUBEVEC_INT8_ISA forces the int8 kernel: an unknown name or one this CPU lacks is a one-line
// error naming the variable (never an illegal instruction); a kernel the CPU has is the only one
// measured.
TEST_F(TuneCli, ForcingAnInt8KernelIsCheckedAgainstTheCpu) {
  namespace g = cubevec::ops::gemm;
  const auto tune_with = [&](const std::string& isa) {
    const std::string file = (dir_ / ("tuning-" + isa + ".json")).string();
    return cubevec_cli_test::run_program({"/usr/bin/env", "CUBEVEC_INT8_ISA=" + isa, CUBEVEC_BINARY, "tune", "--tune-cache", file,
                                          "--families", "int8", "--shapes", "skinny", "--cube-threads", "1"},
                                         dir_);
  };
  const auto unknown = tune_with("sse2");
  EXPECT_EQ(unknown.status, 1);
  EXPECT_NE(unknown.err.find("CUBEVEC_INT8_ISA=sse2: unknown int8 ISA (expected one of: amx, avx512_vnni, avx_vnni, avx2, portable)"),
            std::string::npos)
      << unknown.err;
  for (g::Int8Isa isa : {g::Int8Isa::amx, g::Int8Isa::avx512_vnni, g::Int8Isa::avx_vnni, g::Int8Isa::avx2, g::Int8Isa::portable}) {
    const std::string name(g::int8_isa_name(isa));
    SCOPED_TRACE(name);
    const auto run = tune_with(name);
    if (!g::int8_isa_supported(isa)) {
      EXPECT_EQ(run.status, 1);
      EXPECT_NE(run.err.find("CUBEVEC_INT8_ISA=" + name + ": this CPU does not support that ISA"), std::string::npos) << run.err;
      continue;
    }
    ASSERT_EQ(run.status, 0) << run.err;
    const nlohmann::json doc = nlohmann::json::parse(read_file((dir_ / ("tuning-" + name + ".json")).string()));
    ASSERT_EQ(doc["gemm"].size(), 1u);
    EXPECT_EQ(doc["gemm"][0]["choice"]["kernel"], name);
    for (const auto& considered : doc["gemm"][0]["considered"]) EXPECT_EQ(considered["kernel"], name);
  }
  // A bad value is the variable's error even with a valid tuning file holding int8 entries (it was
  // reported as the file's, with the advice to delete it).
  const auto with_file = cubevec_cli_test::run_program(
      {"/usr/bin/env", "CUBEVEC_INT8_ISA=AMX", CUBEVEC_BINARY, "tune", "--tune-cache", (dir_ / "tuning-portable.json").string(),
       "--families", "int8", "--shapes", "skinny", "--cube-threads", "1"},
      dir_);
  EXPECT_EQ(with_file.status, 1);
  EXPECT_NE(with_file.err.find("error: CUBEVEC_INT8_ISA=AMX: unknown int8 ISA"), std::string::npos) << with_file.err;
  EXPECT_EQ(with_file.err.find("not valid"), std::string::npos) << with_file.err;
}

// A run that forces an int8 kernel adds its rates to the file's entry instead of replacing the
// other kernels' (the next unforced run measured them all again, warning about the forced entry).
TEST_F(TuneCli, AForcedKernelsRatesJoinTheFilesEntry) {
  namespace g = cubevec::ops::gemm;
  const auto candidates = g::candidate_variants(g::GemmFamily::int8, g::best_isa());
  if (candidates.front().int8 == g::Int8Isa::portable) GTEST_SKIP() << "this CPU has no int8 kernel but the portable one";
  const std::string file = (dir_ / "tuning.json").string();
  const auto tune = [&](const std::vector<std::string>& env) {
    std::vector<std::string> argv{"/usr/bin/env"};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.insert(argv.end(),
                {CUBEVEC_BINARY, "tune", "--tune-cache", file, "--families", "int8", "--shapes", "skinny", "--cube-threads", "1"});
    return cubevec_cli_test::run_program(argv, dir_);
  };
  const auto kernels_of = [](const nlohmann::json& entry) {
    std::set<std::string> out;
    for (const auto& r : entry["considered"]) out.insert(r["kernel"].get<std::string>());
    return out;
  };
  ASSERT_EQ(tune({}).status, 0);
  const nlohmann::json first = nlohmann::json::parse(read_file(file))["gemm"];
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(kernels_of(first[0]).count("portable"), 0u);

  const auto forced = tune({"CUBEVEC_INT8_ISA=portable"});
  ASSERT_EQ(forced.status, 0) << forced.err;
  EXPECT_NE(forced.err.find("no measurement of a kernel this process weighs"), std::string::npos) << forced.err;
  const nlohmann::json second = nlohmann::json::parse(read_file(file))["gemm"];
  ASSERT_EQ(second.size(), 1u) << second.dump();
  std::set<std::string> both = kernels_of(first[0]);
  both.insert("portable");
  EXPECT_EQ(kernels_of(second[0]), both);
  EXPECT_EQ(second[0]["considered"].size(), first[0]["considered"].size() + 3) << "three L2 shares of the portable kernel";
  EXPECT_EQ(second[0]["choice"]["kernel"], first[0]["choice"]["kernel"]) << "the portable kernel is the slowest";

  const auto again = tune({});
  ASSERT_EQ(again.status, 0) << again.err;
  EXPECT_NE(again.err.find("already in the tuning file"), std::string::npos) << again.err;
  EXPECT_EQ(again.err.find("warning"), std::string::npos) << again.err;
  EXPECT_EQ(nlohmann::json::parse(read_file(file))["gemm"], second);
}

}  // namespace tune_cli_test
