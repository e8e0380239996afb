// GEMM calibration: cache sizes from (fake) sysfs, the blocking they give, every f32 variant against
// a double loop, the choice rule, a real calibration, and the tuning file (round trip, entries from
// another CPU, malformed files).
#include "ops/gemm/tuner.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sys/stat.h>

#include "common/amx_model_scope.h"
#include "common/temp_dir.h"
#include "base/error.h"
#include "base/output_file.h"
#include "base/regular_file.h"

namespace cubevec {
namespace gemm_tuner_test {  // named after the file: unity batches never mix two files' helpers

namespace g = ops::gemm;
using testing::TempDir;

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

void fake_cache(const std::filesystem::path& dir, int index, const std::string& level, const std::string& type, const std::string& size) {
  const auto entry = dir / ("index" + std::to_string(index));
  write_text(entry / "level", level + "\n");
  write_text(entry / "type", type + "\n");
  write_text(entry / "size", size + "\n");
}

TEST(CpuCaches, SizesComeFromSysfsWithItsUnits) {
  TempDir dir;
  fake_cache(dir.path, 0, "1", "Data", "48K");
  fake_cache(dir.path, 1, "1", "Instruction", "64K");
  fake_cache(dir.path, 2, "2", "Unified", "2048K");
  fake_cache(dir.path, 3, "3", "Unified", "32M");
  const g::CpuCaches caches = g::read_cpu_caches(dir.path.string());
  EXPECT_EQ(caches.source, "sysfs");
  EXPECT_EQ(caches.l1d, 48 << 10);  // the instruction cache is not the L1 data cache
  EXPECT_EQ(caches.l2, 2048 << 10);
  EXPECT_EQ(caches.l3, 32 << 20);
}

TEST(CpuCaches, UnparsableOrMissingLevelsFallBack) {
  TempDir dir;
  fake_cache(dir.path, 0, "1", "Data", "lots");
  fake_cache(dir.path, 2, "2", "Unified", "1024K");
  fake_cache(dir.path, 3, "3", "Unified", "-5M");
  const g::CpuCaches fallback = g::read_cpu_caches((dir.path / "absent").string());
  EXPECT_NE(fallback.source, "sysfs");
  const g::CpuCaches caches = g::read_cpu_caches(dir.path.string());
  EXPECT_EQ(caches.l2, 1 << 20);
  EXPECT_EQ(caches.l1d, fallback.l1d);  // "lots": not a size
  EXPECT_EQ(caches.l3, fallback.l3);    // "-5M": not a size
  EXPECT_GT(caches.l1d, 0);
}

TEST(GemmBlocking, RowBlockFillsTheL2ShareInWholePanels) {
  g::CpuCaches caches;
  caches.l2 = 1 << 20, caches.l3 = 32 << 20;
  if (g::isa_supported(g::Isa::avx512)) {
    // f32 AVX-512: KC 768, MR 14: the A block (MC x 768 x 4 bytes) within L2 / 2 = 512 KiB -> 170 rows -> 168.
    const g::Blocking b = g::blocking_of({g::Bf16Path::f32, 2}, g::Isa::avx512, caches);
    EXPECT_EQ(b.kc, 768);
    EXPECT_EQ(b.mc, 168);
    EXPECT_EQ(b.nc, 2720);  // 8 MiB / (768 x 4) = 2730 -> multiple of 32
    caches.l2 = 2 << 20;
    EXPECT_EQ(g::blocking_of({g::Bf16Path::f32, 2}, g::Isa::avx512, caches).mc, 336);
    EXPECT_EQ(g::blocking_of({g::Bf16Path::f32, 8}, g::Isa::avx512, caches).mc, 84);
  }
  // A tiny L2 still gets one register panel, a huge L3 at most 4096 columns.
  caches.l2 = 4 << 10, caches.l3 = int64_t{1} << 34;
  const g::Blocking tiny = g::blocking_of({g::Bf16Path::f32, 8}, g::Isa::portable, caches);
  EXPECT_GT(tiny.mc, 0);
  EXPECT_LE(tiny.mc, 16);
  EXPECT_LE(tiny.nc, 4096);
}

TEST(GemmVariants, EveryF32VariantMatchesTheDoubleLoop) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1, 1);
  const int64_t m = 75, n = 70, k = 1601;  // edge tiles, three K blocks of 768
  std::vector<float> a(static_cast<std::size_t>(m * k)), w(static_cast<std::size_t>(n * k));
  for (float& v : a) v = dist(rng);
  for (float& v : w) v = dist(rng);
  g::CpuCaches tiny;
  tiny.l2 = 64 << 10;  // several row blocks
  for (g::Isa isa : {g::Isa::avx512, g::Isa::avx2, g::Isa::portable}) {
    if (!g::isa_supported(isa)) continue;
    for (const g::GemmVariant& variant : g::candidate_variants(g::GemmFamily::f32, isa))
      for (const g::CpuCaches& caches : {g::this_cpu_caches(), tiny}) {
        std::vector<float> c(static_cast<std::size_t>(m * n), -9.0f);
        g::Problem p;
        p.m = m, p.n = n, p.k = k, p.a = a.data(), p.lda = k, p.b = w.data(), p.ldb = k, p.trans_b = true;
        p.c = c.data(), p.ldc = n;
        g::sgemm_variant(p, isa, 2, variant, caches);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double want = 0;
            for (int64_t q = 0; q < k; ++q) want += double(a[i * k + q]) * w[j * k + q];
            ASSERT_NEAR(c[i * n + j], want, 2e-6 * k) << g::isa_name(isa) << " " << variant.name() << " " << caches.text();
          }
      }
  }
}

TEST(GemmVariants, EveryInt8VariantMatchesTheIntegerLoop) {
  const cubevec::testing::AmxModelWhereNoAmx amx_tiles;  // AMX on the tile model where the CPU has none
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> dist(-127, 127);
  const int64_t m = 45, n = 70, k = 1600;  // edge tiles on every kernel (MR 32 / 14 / 6 / 4, NR 32 / 16); K 25 AMX blocks
  std::vector<uint8_t> a(static_cast<std::size_t>(m * k));
  std::vector<int8_t> w(static_cast<std::size_t>(n * k));
  for (uint8_t& v : a) v = static_cast<uint8_t>(dist(rng) + 128);
  for (int8_t& v : w) v = static_cast<int8_t>(dist(rng));
  std::vector<float> row_scale(static_cast<std::size_t>(m)), col_scale(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < m; ++i) row_scale[static_cast<std::size_t>(i)] = 0.001f * static_cast<float>(i + 1);
  for (int64_t j = 0; j < n; ++j) col_scale[static_cast<std::size_t>(j)] = 0.002f * static_cast<float>(j + 3);
  g::CpuCaches tiny;
  tiny.l2 = 64 << 10;  // several row blocks of 14 rows
  std::vector<g::GemmVariant> variants;
  for (g::Int8Isa kernel : {g::Int8Isa::amx, g::Int8Isa::avx512_vnni, g::Int8Isa::avx_vnni, g::Int8Isa::avx2, g::Int8Isa::portable})
    if (g::int8_isa_supported(kernel))
      for (int share : {2, 4, 8}) variants.push_back({g::Bf16Path::f32, share, false, kernel});
  for (const g::GemmVariant& v : g::candidate_variants(g::GemmFamily::int8, g::best_isa()))
    EXPECT_NE(std::find(variants.begin(), variants.end(), v), variants.end()) << v.name();
  for (const g::GemmVariant& variant : variants) {
    const auto packed = g::pack_int8_weight(w.data(), n, k, k, *variant.int8);
    for (const g::CpuCaches& caches : {g::this_cpu_caches(), tiny}) {
      std::vector<float> c(static_cast<std::size_t>(m * n), -9.0f);
      g::Int8Problem p;
      p.m = m, p.n = n, p.a = a.data(), p.lda = k, p.b = packed.get(), p.c = c.data(), p.ldc = n;
      p.epilogue.row_scale = row_scale.data(), p.epilogue.col_scale = col_scale.data();
      g::gemm_int8_variant(p, 2, variant.l2_share, caches);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          int64_t sum = 0;  // the exact product of the signed values
          for (int64_t q = 0; q < k; ++q)
            sum += (int64_t{a[static_cast<std::size_t>(i * k + q)]} - 128) * w[static_cast<std::size_t>(j * k + q)];
          const double want = static_cast<double>(sum) * row_scale[static_cast<std::size_t>(i)] * col_scale[static_cast<std::size_t>(j)];
          ASSERT_NEAR(c[static_cast<std::size_t>(i * n + j)], want, 1e-6 * std::abs(want) + 1e-6) << variant.name() << " " << caches.text();
        }
    }
  }
}

TEST(GemmVariants, TheChoiceKeepsThePreferredKernelUnlessAnotherIsClearlyFaster) {
  using P = g::Bf16Path;
  // Shares of one kernel: the fastest.
  EXPECT_EQ(g::choose_variant({{{P::f32, 2}, 300}, {{P::f32, 4}, 320}, {{P::f32, 8}, 310}}), (g::GemmVariant{P::f32, 4}));
  // AMX within the margin of the dot product: AMX stays (the bits then do not depend on noise).
  EXPECT_EQ(g::choose_variant({{{P::amx, 8}, 1000}, {{P::dot, 2}, 1040}}).bf16, P::amx);
  // Clearly faster: the other kernel.
  EXPECT_EQ(g::choose_variant({{{P::amx, 8}, 1000}, {{P::dot, 2}, 1100}}).bf16, P::dot);
  // A half-rate dot product loses to f32 widening.
  EXPECT_EQ(g::choose_variant({{{P::dot, 2}, 160}, {{P::f32, 2}, 300}}), (g::GemmVariant{P::f32, 2}));
  // int8: AVX512-VNNI stays within the margin, and loses to a clearly faster AVX-VNNI.
  const g::GemmVariant vnni512{P::f32, 4, false, g::Int8Isa::avx512_vnni}, vnni256{P::f32, 2, false, g::Int8Isa::avx_vnni};
  EXPECT_EQ(g::choose_variant({{vnni512, 1000}, {vnni256, 1030}}), vnni512);
  EXPECT_EQ(g::choose_variant({{vnni512, 1000}, {vnni256, 1200}}), vnni256);
  EXPECT_THROW(g::choose_variant({}), Error);
}

TEST(GemmVariants, CalibrationMeasuresEveryCandidateAndPicksOneOfThem) {
  const g::Isa isa = g::best_isa();
  for (g::GemmFamily family : {g::GemmFamily::f32, g::GemmFamily::bf16, g::GemmFamily::int8}) {
    const g::GemmTuneKey key{family, isa, g::ShapeClass::skinny, 1};
    int reported = 0;
    const g::GemmTuneEntry entry = g::calibrate(key, g::this_cpu_caches(), [&](const g::VariantRate& r) {
      EXPECT_GT(r.gflops, 0);
      ++reported;
    });
    const auto candidates = g::candidate_variants(family, isa);
    ASSERT_EQ(entry.considered.size(), candidates.size());
    EXPECT_EQ(reported, static_cast<int>(candidates.size()));
    EXPECT_NE(std::find(candidates.begin(), candidates.end(), entry.choice), candidates.end()) << entry.choice.name();
    EXPECT_TRUE(g::bf16_path_available(entry.choice.bf16));
    if (family == g::GemmFamily::f32) {
      EXPECT_EQ(entry.choice.bf16, g::Bf16Path::f32);
    }
    EXPECT_EQ(entry.choice.int8.has_value(), family == g::GemmFamily::int8) << entry.choice.name();
    if (entry.choice.int8) {
      EXPECT_TRUE(g::int8_isa_supported(*entry.choice.int8));
    }
  }
  EXPECT_THROW(g::calibrate({g::GemmFamily::f32, isa, g::ShapeClass::skinny, 0}, g::this_cpu_caches()), Error);
}

g::GemmTuneEntry sample_entry(int threads) {
  g::GemmTuneEntry e;
  e.key = {g::GemmFamily::f32, g::Isa::portable, g::ShapeClass::small, threads};
  e.choice = {g::Bf16Path::f32, 4};
  e.considered = {{{g::Bf16Path::f32, 2}, 10.5}, {{g::Bf16Path::f32, 4}, 12.25}};
  return e;
}

TEST(TuningFile, EntriesSurviveARoundTrip) {
  TempDir dir;
  const std::string path = (dir.path / "sub" / "tuning.json").string();
  g::GemmTuner writer;
  EXPECT_NE(writer.set_file(path, true).find("does not exist yet"), std::string::npos);
  writer.store(sample_entry(2));
  writer.store(sample_entry(5));
  g::GemmTuneEntry int8 = sample_entry(2);
  int8.key.family = g::GemmFamily::int8;
  int8.considered.clear();
  for (const g::GemmVariant& v : g::candidate_variants(g::GemmFamily::int8, int8.key.isa)) int8.considered.push_back({v, 20.0});
  int8.choice = int8.considered.back().variant;
  writer.store(int8);
  writer.save();  // creates the missing directory
  g::GemmTuner reader;
  EXPECT_EQ(reader.set_file(path, true), "");
  auto entries = reader.entries();
  ASSERT_EQ(entries.size(), 3u);
  ASSERT_TRUE(reader.find(int8.key).has_value());
  EXPECT_EQ(reader.find(int8.key)->choice, int8.choice);
  entries.pop_back();
  for (const auto& e : entries) {
    EXPECT_EQ(e.choice, (g::GemmVariant{g::Bf16Path::f32, 4}));
    ASSERT_EQ(e.considered.size(), 2u);
    EXPECT_DOUBLE_EQ(e.considered[1].gflops, 12.3);  // saved to 0.1 GFLOP/s
  }
  EXPECT_TRUE(reader.find(sample_entry(5).key).has_value());
  EXPECT_FALSE(reader.find(sample_entry(3).key).has_value());
}

// An entry measured before a kernel this CPU can run was added (a file from before AMX-INT8), or
// while another kernel was forced, is measured again rather than keeping the old choice for good.
TEST(TuningFile, AnEntryThatNeverMeasuredAnAvailableKernelIsMeasuredAgain) {
  TempDir dir;
  const std::string path = (dir.path / "tuning.json").string();
  g::GemmTuneEntry int8 = sample_entry(2);
  int8.key.family = g::GemmFamily::int8;
  const std::vector<g::GemmVariant> candidates = g::candidate_variants(g::GemmFamily::int8, int8.key.isa);
  if (candidates.front().int8 == g::Int8Isa::portable) GTEST_SKIP() << "this CPU has no int8 kernel but the portable one";
  // Every candidate but the first kernel's, and the portable kernel's (which a forced run measures).
  int8.considered.clear();
  for (const g::GemmVariant& v : candidates)
    if (v.int8 != candidates.front().int8) int8.considered.push_back({v, 20.0});
  for (int share : {2, 4, 8}) int8.considered.push_back({{g::Bf16Path::f32, share, false, g::Int8Isa::portable}, 2.0});
  int8.choice = int8.considered.front().variant;
  const nlohmann::json entry = g::gemm_entry_json(int8, g::cpu_model_name(), g::this_cpu_caches());
  write_text(path, nlohmann::json{{"format", "cubevec-tuning"}, {"version", 1}, {"gemm", {entry}}}.dump());
  g::GemmTuner tuner;
  const std::string warning = tuner.set_file(path, true);
  EXPECT_NE(warning.find("1 GEMM entry has no measurement of a kernel this process weighs"), std::string::npos) << warning;
  EXPECT_TRUE(tuner.entries().empty());
  // Until it is measured, the entry stays in the file (a save for another key keeps it)...
  tuner.store(sample_entry(2));
  tuner.save();
  const nlohmann::json saved = nlohmann::json::parse(read_regular_file(path));
  ASSERT_EQ(saved["gemm"].size(), 2u) << saved.dump();
  const nlohmann::json& kept = saved["gemm"][0]["family"] == "int8" ? saved["gemm"][0] : saved["gemm"][1];
  EXPECT_EQ(kept["considered"].size(), int8.considered.size()) << saved.dump();
  // ...and a measurement of the missing kernel adds its rates to the entry's.
  g::GemmTuneEntry fresh = int8;
  fresh.considered.clear();
  for (const g::GemmVariant& v : candidates)
    if (v.int8 == candidates.front().int8) fresh.considered.push_back({v, 30.0});
  const g::GemmTuneEntry merged = tuner.add_measurements(fresh);
  EXPECT_EQ(merged.considered.size(), fresh.considered.size() + int8.considered.size());
  EXPECT_EQ(merged.choice.int8, candidates.front().int8) << "the faster kernel's variant";
  ASSERT_EQ(tuner.entries().size(), 2u);
  tuner.save();
  g::GemmTuner reader;
  EXPECT_EQ(reader.set_file(path, true), "") << "every candidate measured now";
  EXPECT_EQ(reader.entries().size(), 2u);
}

// A calibration that did not measure every variant (a forced kernel) keeps the earlier rates of
// the others, and the choice is made again over all of them.
TEST(TuningFile, MergedMeasurementsKeepTheRatesNotMeasuredNow) {
  g::GemmTuneEntry earlier = sample_entry(2), fresh = sample_entry(2);
  earlier.considered = {{{g::Bf16Path::f32, 4}, 5.0}, {{g::Bf16Path::f32, 8}, 30.0}};
  earlier.choice = {g::Bf16Path::f32, 8};
  fresh.considered = {{{g::Bf16Path::f32, 2}, 10.0}, {{g::Bf16Path::f32, 4}, 20.0}};
  fresh.choice = {g::Bf16Path::f32, 4};
  const g::GemmTuneEntry merged = g::merge_measurements(fresh, earlier);
  ASSERT_EQ(merged.considered.size(), 3u);
  EXPECT_EQ(merged.considered[0].gflops, 10.0);
  EXPECT_EQ(merged.considered[1].gflops, 20.0) << "a variant measured now replaces its earlier rate";
  EXPECT_EQ(merged.considered[2].variant, (g::GemmVariant{g::Bf16Path::f32, 8}));
  EXPECT_EQ(merged.choice, (g::GemmVariant{g::Bf16Path::f32, 8})) << "the fastest over both measurements";
  // The tuner merges into a stored entry the same way.
  g::GemmTuner tuner;
  tuner.store(earlier);
  EXPECT_EQ(tuner.add_measurements(fresh).considered.size(), 3u);
  ASSERT_EQ(tuner.entries().size(), 1u);
  EXPECT_EQ(tuner.entries()[0].choice, (g::GemmVariant{g::Bf16Path::f32, 8}));
}

TEST(TuningFile, AnotherCpusEntriesAreIgnoredWithAWarningAndKept) {
  TempDir dir;
  const std::string path = (dir.path / "tuning.json").string();
  nlohmann::json foreign = g::gemm_entry_json(sample_entry(2), "Some Other CPU", g::this_cpu_caches());
  g::CpuCaches other_caches = g::this_cpu_caches();
  other_caches.l2 *= 2;
  nlohmann::json other_l2 = g::gemm_entry_json(sample_entry(3), g::cpu_model_name(), other_caches);
  nlohmann::json mine = g::gemm_entry_json(sample_entry(4), g::cpu_model_name(), g::this_cpu_caches());
  write_text(path, nlohmann::json{{"format", "cubevec-tuning"}, {"version", 1}, {"gemm", {foreign, other_l2, mine}}}.dump());
  g::GemmTuner tuner;
  const std::string warning = tuner.set_file(path, true);
  EXPECT_NE(warning.find("2 GEMM entries were measured on another CPU"), std::string::npos) << warning;
  ASSERT_EQ(tuner.entries().size(), 1u);
  EXPECT_EQ(tuner.entries()[0].key.threads, 4);
  tuner.save();
  const nlohmann::json saved = nlohmann::json::parse(read_regular_file(path));
  ASSERT_EQ(saved["gemm"].size(), 3u);  // the other machines' entries are still there
  EXPECT_EQ(saved["gemm"][0]["cpu"], "Some Other CPU");
}

TEST(TuningFile, MalformedFilesAreErrorsWhenNamedAndLeftAloneOtherwise) {
  TempDir dir;
  const std::string path = (dir.path / "tuning.json").string();
  const nlohmann::json good = g::gemm_entry_json(sample_entry(2), g::cpu_model_name(), g::this_cpu_caches());
  auto with = [&](const char* field, nlohmann::json value) {
    nlohmann::json e = good;
    e[field] = value;
    return nlohmann::json{{"format", "cubevec-tuning"}, {"version", 1}, {"gemm", {e}}}.dump();
  };
  const std::pair<std::string, std::string> cases[] = {
      {"{not json", "tuning.json"},
      {"[]", "expected a JSON object"},
      {R"({"format": "other", "version": 1})", "field 'format'"},
      {R"({"format": "cubevec-tuning", "version": "1"})", "field 'version'"},
      {R"({"format": "cubevec-tuning", "version": 1, "gemm": {}})", "field 'gemm' must be an array"},
      {with("family", "f16"), "unknown GEMM family 'f16'"},
      {with("threads", 0), "field 'threads' must be in [1, 4096]"},
      // Past int64_t: named as written, not wrapped to a negative number.
      {with("threads", uint64_t{1} << 63), "field 'threads' must be in [1, 4096], got 9223372036854775808"},
      {with("choice", {{"kernel", "sse"}, {"l2_share", 2}}), "unknown f32 kernel 'sse'"},
      {with("choice", {{"kernel", "f32"}, {"l2_share", 1000}, {"prefetch", false}}), "field 'l2_share'"},
      {with("choice", {{"kernel", "f32"}, {"l2_share", 2}, {"prefetch", 1}}), "field 'prefetch'"},
      {with("considered", {{{"kernel", "f32"}, {"l2_share", 2}, {"prefetch", true}, {"gflops", -1}}}), "'gflops'"},
      {with("caches", "big"), "field 'caches'"},
      {with("choice", {{"kernel", "avx512_vnni"}, {"l2_share", 2}, {"prefetch", false}}), "unknown f32 kernel 'avx512_vnni'"},
      {with("family", "int8"), "unknown int8 kernel 'f32'"},
  };
  std::vector<std::pair<std::string, std::string>> all(std::begin(cases), std::end(cases));
  all.push_back({nlohmann::json{{"format", "cubevec-tuning"}, {"version", 1}, {"gemm", {good, good}}}.dump(),
                 "gemm entry 1: repeats the key of gemm entry 0 (f32 portable small 2 threads)"});
  for (const auto& [text, expected] : all) {
    write_text(path, text);
    g::GemmTuner strict;
    try {
      strict.set_file(path, true);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(path), std::string::npos) << message;
      EXPECT_NE(message.find(expected), std::string::npos) << message;
    }
    g::GemmTuner lenient;  // the default file: a warning, and the file is not overwritten
    EXPECT_NE(lenient.set_file(path, false).find("not using it"), std::string::npos) << text;
    lenient.store(sample_entry(2));
    lenient.save();
    EXPECT_EQ(read_regular_file(path), text);
  }
  // Another format version is not an error, and another cubevec's file is neither used nor replaced.
  const std::string newer_text = R"({"format": "cubevec-tuning", "version": 99, "gemm": 5, "attention": [1]})";
  write_text(path, newer_text);
  g::GemmTuner newer;
  EXPECT_NE(newer.set_file(path, true).find("format version 99"), std::string::npos);
  newer.store(sample_entry(2));
  newer.save();
  EXPECT_EQ(read_regular_file(path), newer_text);
}

// Two processes that read the file before either saved: each save merges with the file as it is
// then, so neither drops the other's measurements (the race a clean-clone CI once lost a test to),
// and an entry a process only read never replaces a newer one in the file.
TEST(TuningFile, SavesMergeWithWhatOtherProcessesSavedMeanwhile) {
  TempDir dir;
  const std::string path = (dir.path / "tuning.json").string();
  g::GemmTuner first, second, late;
  first.set_file(path, true);
  second.set_file(path, true);
  first.store(sample_entry(2));
  first.save();
  second.store(sample_entry(3));
  second.save();
  late.set_file(path, true);
  EXPECT_TRUE(late.find(sample_entry(2).key).has_value()) << "the second save kept the first's entry";
  EXPECT_TRUE(late.find(sample_entry(3).key).has_value());
  // `late` only read the 2-thread entry; `first` measures it anew (a tune --again) and saves.
  g::GemmTuneEntry again = sample_entry(2);
  again.considered = {{{g::Bf16Path::f32, 2}, 50.0}, {{g::Bf16Path::f32, 4}, 12.0}};
  again.choice = {g::Bf16Path::f32, 2};
  first.add_measurements(again);
  first.save();
  late.store(sample_entry(4));
  late.save();
  g::GemmTuner reader;
  EXPECT_EQ(reader.set_file(path, true), "");
  ASSERT_TRUE(reader.find(sample_entry(2).key).has_value());
  EXPECT_EQ(reader.find(sample_entry(2).key)->choice, (g::GemmVariant{g::Bf16Path::f32, 2})) << "late's stale copy did not replace it";
  EXPECT_EQ(reader.entries().size(), 3u);
  // A process that decided a key itself replaces the file's entry for it.
  late.store(sample_entry(2));
  late.save();
  g::GemmTuner after;
  after.set_file(path, true);
  EXPECT_EQ(after.find(sample_entry(2).key)->choice, (g::GemmVariant{g::Bf16Path::f32, 4}));
}

// A file replaced by another cubevec's (another format version) after this process read it is not
// overwritten by a save: an error naming it, the file as it was.
TEST(TuningFile, ASaveLeavesAFileOfAnotherVersionWrittenMeanwhileAlone) {
  TempDir dir;
  const std::string path = (dir.path / "tuning.json").string();
  g::GemmTuner tuner;
  tuner.set_file(path, false);
  tuner.store(sample_entry(2));
  tuner.save();
  const std::string newer = R"({"format": "cubevec-tuning", "version": 2, "gemm": [{"precious": 1}], "other": "x"})";
  write_text(path, newer);
  tuner.store(sample_entry(3));
  try {
    tuner.save();
    ADD_FAILURE() << "saved over a version 2 file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tuning file " + path + " has format version 2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_regular_file(path), newer);
  EXPECT_THROW(g::write_tuning_section(path, "attention", nlohmann::json::array()), Error);
  EXPECT_EQ(read_regular_file(path), newer);
}

// A generation run's outputs land together at its end (OutputBatch), but the tuning file is a cache
// other processes read: each save is in place at once, so the next save (of either section) and
// other processes build on it, and a run that then fails keeps what it calibrated.
TEST(TuningFile, SavesLandAtOnceWhileARunsOutputsWait) {
  TempDir dir;
  const std::string path = (dir.path / "tuning.json").string();
  OutputBatch batch;
  g::GemmTuner tuner;
  tuner.set_file(path, true);
  tuner.store(sample_entry(2));
  tuner.save();
  ASSERT_TRUE(std::filesystem::exists(path)) << "not held back for the run's end";
  g::write_tuning_section(path, "attention", nlohmann::json::array());
  const nlohmann::json saved = nlohmann::json::parse(read_regular_file(path));
  EXPECT_EQ(saved["gemm"].size(), 1u) << saved.dump();
  EXPECT_TRUE(saved.contains("attention")) << saved.dump();
}

// Before measuring a key, choose() takes the file's lock and reads the file again: a key another
// process measured meanwhile is used as it is, not measured a second time (which could pick
// another variant).
TEST(TuningFile, ChooseUsesAKeyAnotherProcessSavedMeanwhile) {
  TempDir dir;
  const std::string path = (dir.path / "cache" / "cubevec" / "tuning.json").string();  // a fresh cache folder
  g::GemmTuner reader, other;
  reader.set_file(path, true);
  other.set_file(path, true);
  g::GemmTuneEntry measured = sample_entry(2);
  measured.considered = {{{g::Bf16Path::f32, 2}, 1.5}, {{g::Bf16Path::f32, 4}, 2.5}, {{g::Bf16Path::f32, 8}, 3.5}};
  measured.choice = {g::Bf16Path::f32, 8};
  other.store(measured);
  other.save();
  ASSERT_FALSE(reader.find(measured.key).has_value());
  const g::GemmTuneEntry chosen = reader.choose(measured.key);
  EXPECT_EQ(chosen.choice, measured.choice);
  ASSERT_EQ(chosen.considered.size(), 3u) << "read from the file, not measured (a measurement has no 1.5 GFLOP/s rate)";
  EXPECT_DOUBLE_EQ(chosen.considered[0].gflops, 1.5);
  // The lock file was made in the folder the tuning file lives in: processes that start together on
  // a fresh cache folder take turns too.
  EXPECT_TRUE(std::filesystem::is_regular_file(FileLock::lock_path(path)));
}

TEST(TuningFile, ARefusedPathIsAnErrorOnSave) {
  TempDir dir;
  const std::string fifo = (dir.path / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  g::GemmTuner tuner;
  EXPECT_THROW(tuner.set_file(fifo, true), Error);  // not a regular file: refused, not read (no hang)
}

}  // namespace gemm_tuner_test
}  // namespace cubevec
