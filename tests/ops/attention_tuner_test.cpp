// The attention autotuner: runtime mode tunes once per key and reuses the pick (and runs what the
// table says), the static and manual modes, and the JSON cache: round trip, missing, stale,
// other-version and malformed files (a clear error naming the file, and the table untouched).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "device/device.h"
#include "ops/attention.h"
#include "ops/attention_tuner.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace attention_tuner_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using ops::AttentionImpl;
using ops::AttentionLayout;
using ops::AttentionTuneChoice;
using ops::AttentionTuneKey;
using ops::AttentionTuner;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("cubevec_tune_" + std::to_string(::getpid()) + "_" + name)).string();
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// The names of the Cube kernels a device ran.
std::vector<std::string> cube_kernels(Device& device) {
  device.synchronize();
  std::vector<std::string> names;
  for (const auto& r : device.trace().records())
    if (r.desc.unit == Unit::cube) names.push_back(r.desc.name);
  return names;
}

class AttentionTunerTest : public ::testing::Test {
 protected:
  void SetUp() override { AttentionTuner::global().clear(); }
  void TearDown() override {
    AttentionTuner::global().clear();
    AttentionTuner::global().set_picks_file(nullptr);
  }
};

TEST_F(AttentionTunerTest, RuntimeModeTunesOncePerKeyAndReusesThePick) {
  Device device(builtin_cpu_profile(), {.trace = true});
  const Stream stream = device.default_stream();
  const Tensor q = random_tensor({1, 40, 2, 16}, 1), k = random_tensor({1, 50, 2, 16}, 2), v = random_tensor({1, 50, 2, 16}, 3);
  const Tensor first = ops::attention_forward(q, k, v, {}, stream);
  const AttentionTuneKey key{1, 2, 16, 40, 50, DType::f32, AttentionLayout::bsnd, ops::AttentionMaskKind::none};
  const auto pick = AttentionTuner::global().find(key);
  ASSERT_TRUE(pick.has_value());
  EXPECT_NE(pick->op_type, AttentionImpl::math) << "a candidate should have worked";
  EXPECT_GT(pick->seconds, 0.0);
  const std::size_t tuning_kernels = cube_kernels(device).size();
  EXPECT_GE(tuning_kernels, 12u) << "four candidates, three calls each, plus the answer";
  // The second call is a lookup: one more Cube kernel, the picked one.
  const Tensor second = ops::attention_forward(q, k, v, {}, stream);
  const auto names = cube_kernels(device);
  ASSERT_EQ(names.size(), tuning_kernels + 1);
  EXPECT_EQ(names.back(), pick->op_type == AttentionImpl::flash ? "attention_flash" : "attention_cv_matmul");
  EXPECT_EQ(values(first), values(second));
  EXPECT_EQ(AttentionTuner::global().entries().size(), 1u);
  // A mask is part of the key: a new entry.
  Tensor mask = Tensor::empty({40, 50}, DType::boolean);
  std::memset(mask.mutable_data_ptr(), 1, 2000);
  ops::AttentionOptions masked;
  masked.mask = mask;
  ops::attention_forward(q, k, v, masked, stream);
  EXPECT_EQ(AttentionTuner::global().entries().size(), 2u);
}

// A picks file shared with other processes: reloaded before a key is tuned (a pick another process
// saved meanwhile is used as it is, with no tuning), saved right after a key is tuned.
struct FakePicksFile : ops::AttentionPicksFile {
  nlohmann::json section;  // what "another process" saved
  int reloads = 0, saves = 0;
  void reload() noexcept override {
    ++reloads;
    nlohmann::json foreign;
    AttentionTuner::global().add_section(section, "fp", foreign, /*only_missing=*/true);
  }
  void save() noexcept override { ++saves; }
};

TEST_F(AttentionTunerTest, APickAnotherProcessSavedMeanwhileIsUsedWithoutTuning) {
  Device device(builtin_cpu_profile(), {.trace = true});
  const Stream stream = device.default_stream();
  const Tensor q = random_tensor({1, 40, 2, 16}, 1), k = random_tensor({1, 50, 2, 16}, 2), v = random_tensor({1, 50, 2, 16}, 3);
  const AttentionTuneKey key{1, 2, 16, 40, 50, DType::f32, AttentionLayout::bsnd, ops::AttentionMaskKind::none};
  AttentionTuner::global().store(key, {AttentionImpl::math, AttentionLayout::bsnd, 2.0});  // no tuner picks math
  auto file = std::make_shared<FakePicksFile>();
  file->section = AttentionTuner::global().section("fp", nlohmann::json::array());
  AttentionTuner::global().clear();
  AttentionTuner::global().set_picks_file(file);
  ops::attention_forward(q, k, v, {}, stream);
  const auto names = cube_kernels(device);
  ASSERT_EQ(names.size(), 1u) << "the file's pick ran, nothing was timed";
  EXPECT_EQ(names[0], "attention_math");
  EXPECT_EQ(file->reloads, 1);
  EXPECT_EQ(file->saves, 0);
  EXPECT_FALSE(AttentionTuner::global().changed()) << "a reloaded pick is the file's, not a change";
  // A key the file lacks is tuned here and saved at once.
  const Tensor q2 = random_tensor({1, 24, 2, 16}, 4);
  ops::attention_forward(q2, k, v, {}, stream);
  EXPECT_EQ(file->reloads, 2);
  EXPECT_EQ(file->saves, 1);
  EXPECT_GE(cube_kernels(device).size(), 12u) << "tuned";
  // A reload never replaces a pick this process already has.
  const AttentionTuneKey key2{1, 2, 16, 24, 50, DType::f32, AttentionLayout::bsnd, ops::AttentionMaskKind::none};
  const auto mine = AttentionTuner::global().find(key2);
  ASSERT_TRUE(mine.has_value());
  AttentionTuner::global().store(key2, {AttentionImpl::math, AttentionLayout::bsnd, 9.0});
  file->section = AttentionTuner::global().section("fp", nlohmann::json::array());
  AttentionTuner::global().store(key2, *mine);
  file->reload();
  EXPECT_EQ(AttentionTuner::global().find(key2)->op_type, mine->op_type);
}

// int8 attention changes the answer beyond the activations' rounding: the tuner may time only the
// exact kernels, whatever the dtype and whatever this CPU runs.
TEST_F(AttentionTunerTest, RuntimeModeNeverTimesOrPicksInt8Attention) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    AttentionTuner::global().clear();
    Device device(builtin_cpu_profile(), {.trace = true});
    const Tensor q = random_tensor({1, 40, 2, 64}, 1, dtype), k = random_tensor({1, 150, 2, 64}, 2, dtype);
    ops::attention_forward(q, k, k, {}, device.default_stream());
    const auto names = cube_kernels(device);
    ASSERT_GE(names.size(), 12u) << dtype_name(dtype);
    for (const std::string& name : names) EXPECT_EQ(name.find("int8"), std::string::npos) << dtype_name(dtype) << ": ran " << name;
    for (const auto& [key, choice] : AttentionTuner::global().entries()) EXPECT_NE(choice.op_type, AttentionImpl::flash_int8);
  }
}

TEST_F(AttentionTunerTest, RuntimeModeRunsWhatTheTableSays) {
  Device device(builtin_cpu_profile(), {.trace = true});
  const Tensor q = random_tensor({2, 9, 1, 8}, 1), k = random_tensor({2, 9, 1, 8}, 2), v = random_tensor({2, 9, 1, 8}, 3);
  AttentionTuner::global().store({2, 1, 8, 9, 9, DType::f32, AttentionLayout::bsnd, ops::AttentionMaskKind::none},
                                 {AttentionImpl::math, AttentionLayout::bnsd, 0.5});
  ops::attention_forward(q, k, v, {}, device.default_stream());
  EXPECT_EQ(cube_kernels(device), std::vector<std::string>{"attention_math"});
}

TEST_F(AttentionTunerTest, StaticAndManualModesNeverTune) {
  Device device(builtin_cpu_profile(), {.trace = true});
  const Tensor q = random_tensor({1, 9, 1, 8}, 1);
  ops::AttentionOptions o;
  o.opt_mode = ops::AttentionOptMode::static_table;
  ops::attention_forward(q, q, q, o, device.default_stream());
  o.opt_mode = ops::AttentionOptMode::manual;
  o.op_type = AttentionImpl::math;
  ops::attention_forward(q, q, q, o, device.default_stream());
  EXPECT_EQ(cube_kernels(device), (std::vector<std::string>{"attention_flash", "attention_math"}));
  EXPECT_TRUE(AttentionTuner::global().entries().empty());
}

TEST_F(AttentionTunerTest, CacheFileRoundTrip) {
  const std::string path = temp_path("roundtrip.json");
  const AttentionTuneKey a{1, 24, 128, 4608, 4608, DType::f32, AttentionLayout::bsnd, ops::AttentionMaskKind::none};
  const AttentionTuneKey b{2, 12, 72, 4680, 512, DType::bf16, AttentionLayout::bsh, ops::AttentionMaskKind::mask_4d};
  AttentionTuner::global().store(a, {AttentionImpl::cv_pipelined, AttentionLayout::bsnd, 1.25});
  AttentionTuner::global().store(b, {AttentionImpl::flash, AttentionLayout::bnsd, 0.5});
  AttentionTuner::global().save(path, "fp");
  AttentionTuner::global().clear();
  EXPECT_EQ(AttentionTuner::global().load(path, "fp"), "");
  const auto ea = AttentionTuner::global().find(a), eb = AttentionTuner::global().find(b);
  ASSERT_TRUE(ea && eb);
  EXPECT_EQ(ea->op_type, AttentionImpl::cv_pipelined);
  EXPECT_EQ(ea->kernel_layout, AttentionLayout::bsnd);
  EXPECT_DOUBLE_EQ(ea->seconds, 1.25);
  EXPECT_EQ(eb->op_type, AttentionImpl::flash);
  EXPECT_EQ(eb->kernel_layout, AttentionLayout::bnsd);
  EXPECT_EQ(b.text(), "B2 N12 D72 Sq4680 Sk512 bf16 BSH mask 4d");
  std::filesystem::remove(path);
}

TEST_F(AttentionTunerTest, TuningFileSectionKeepsOtherDevicesEntriesAside) {
  const AttentionTuneKey a{1, 24, 128, 4608, 4608, DType::f32, AttentionLayout::bsnd, ops::AttentionMaskKind::none};
  const AttentionTuneKey b{2, 12, 72, 4680, 512, DType::bf16, AttentionLayout::bsnd, ops::AttentionMaskKind::mask_2d};
  AttentionTuner::global().store(a, {AttentionImpl::cv_pipelined, AttentionLayout::bsnd, 1.25});
  nlohmann::json none = nlohmann::json::array();
  const nlohmann::json mine = AttentionTuner::global().section("fp-this", none);
  AttentionTuner::global().clear();
  AttentionTuner::global().store(b, {AttentionImpl::flash, AttentionLayout::bnsd, 0.5});
  nlohmann::json section = AttentionTuner::global().section("fp-other", mine);  // both devices' entries
  ASSERT_EQ(section.size(), 2u);
  AttentionTuner::global().clear();
  nlohmann::json foreign;
  EXPECT_EQ(AttentionTuner::global().add_section(section, "fp-this", foreign), 1u);
  EXPECT_TRUE(AttentionTuner::global().find(a).has_value());
  EXPECT_FALSE(AttentionTuner::global().find(b).has_value());
  ASSERT_EQ(foreign.size(), 1u);
  EXPECT_EQ(foreign[0]["fingerprint"], "fp-other");
  EXPECT_EQ(AttentionTuner::global().section("fp-this", foreign).size(), 2u);  // written back with ours
  section[1]["op_type"] = "magic";
  const std::string message = message_of([&] { AttentionTuner::global().add_section(section, "fp-this", foreign); });
  EXPECT_NE(message.find("attention entry 1:"), std::string::npos) << message;
  // The same key twice under this device's fingerprint: refused naming both (another device's
  // entries may repeat ours: they are not used).
  nlohmann::json repeated = nlohmann::json::array({mine[0], mine[0]});
  EXPECT_NE(message_of([&] {
              AttentionTuner::global().add_section(repeated, "fp-this", foreign);
            }).find("attention entry 1 repeats the key of attention entry 0"),
            std::string::npos);
  EXPECT_EQ(AttentionTuner::global().add_section(repeated, "fp-elsewhere", foreign), 2u);
  EXPECT_NE(message_of([&] { AttentionTuner::global().add_section(nlohmann::json::object(), "fp", foreign); }).find("must be an array"),
            std::string::npos);
}

// Two processes finishing side by side: each writes back the file's attention section as it is now
// plus its own entries for keys the file lacks, so neither drops the other's, and a key both tuned
// keeps the pick written first (the one later runs have been reading).
TEST_F(AttentionTunerTest, TheMergedSectionKeepsTheFilesEntriesAndAddsOnlyNewKeys) {
  const AttentionTuneKey a{1, 24, 128, 4608, 4608, DType::f32, AttentionLayout::bsnd, ops::AttentionMaskKind::none};
  const AttentionTuneKey b{2, 12, 72, 4680, 512, DType::bf16, AttentionLayout::bsnd, ops::AttentionMaskKind::mask_2d};
  const nlohmann::json none = nlohmann::json::array();
  AttentionTuner::global().store(a, {AttentionImpl::cv_pipelined, AttentionLayout::bsnd, 1.25});
  nlohmann::json current = AttentionTuner::global().section("fp-this", none);  // another process saved a
  AttentionTuner::global().clear();
  AttentionTuner::global().store(b, {AttentionImpl::math, AttentionLayout::bsnd, 0.75});
  const nlohmann::json other_device = AttentionTuner::global().section("fp-other", none);
  current.push_back(other_device[0]);
  AttentionTuner::global().clear();
  // This process tuned a (picking otherwise) and b.
  AttentionTuner::global().store(a, {AttentionImpl::flash, AttentionLayout::bnsd, 1.0});
  AttentionTuner::global().store(b, {AttentionImpl::flash, AttentionLayout::bnsd, 0.5});
  const nlohmann::json merged = AttentionTuner::global().merged_section(current, "fp-this", none);
  ASSERT_EQ(merged.size(), 3u) << merged.dump();
  EXPECT_EQ(merged[0], current[0]) << "the file's pick for a stays";
  EXPECT_EQ(merged[1], current[1]) << "another device's entry stays";
  EXPECT_EQ(merged[2]["fingerprint"], "fp-this");
  EXPECT_EQ(merged[2]["op_type"], "flash");
  EXPECT_EQ(merged[2]["q_len"], 4680) << "b is added";
  EXPECT_FALSE(AttentionTuner::global().changed());
  // No section in the file yet: what section() writes.
  EXPECT_EQ(AttentionTuner::global().merged_section(nullptr, "fp-this", none).size(), 2u);
  // A malformed section now is an error naming the entry, not a file replaced.
  current[1]["fingerprint"] = 5;
  const std::string message = message_of([&] { AttentionTuner::global().merged_section(current, "fp-this", none); });
  EXPECT_NE(message.find("attention entry 1:"), std::string::npos) << message;
  EXPECT_NE(message_of([&] { AttentionTuner::global().merged_section(nlohmann::json::object(), "fp", none); }).find("must be an array"),
            std::string::npos);
}

TEST_F(AttentionTunerTest, MissingStaleAndOtherVersionFilesWarnAndLoadNothing) {
  const std::string missing = temp_path("missing.json");
  std::filesystem::remove(missing);
  EXPECT_NE(AttentionTuner::global().load(missing, "fp").find("does not exist yet"), std::string::npos);

  const std::string path = temp_path("stale.json");
  AttentionTuner::global().store({1, 1, 8, 9, 9, DType::f32, AttentionLayout::bsnd, ops::AttentionMaskKind::none},
                                 {AttentionImpl::flash, AttentionLayout::bnsd, 0.1});
  AttentionTuner::global().save(path, "isa=avx2 cube_threads=4 vector_threads=4");
  AttentionTuner::global().clear();
  const std::string warning = AttentionTuner::global().load(path, "isa=avx512 cube_threads=1 vector_threads=1");
  EXPECT_NE(warning.find("is stale: tuned for 'isa=avx2 cube_threads=4 vector_threads=4'"), std::string::npos) << warning;
  EXPECT_NE(warning.find("ignoring its 1 entries"), std::string::npos) << warning;
  EXPECT_TRUE(AttentionTuner::global().entries().empty());

  write_text(path, R"({"format": "cubevec-attention-tune-cache", "version": 7, "fingerprint": "fp", "entries": []})");
  EXPECT_NE(AttentionTuner::global().load(path, "fp").find("has format version 7"), std::string::npos);
  std::filesystem::remove(path);
}

TEST_F(AttentionTunerTest, MalformedFilesAreErrorsNamingFileAndProblem) {
  const std::string path = temp_path("bad.json");
  const std::string entry_ok =
      R"({"batch": 1, "heads": 2, "head_dim": 8, "q_len": 9, "kv_len": 9, "dtype": "f32", "layout": "BSND", "mask": "none", "op_type": "flash", "kernel_layout": "BNSD", "seconds": 0.1})";
  auto doc = [&](const std::string& entries) {
    return R"({"format": "cubevec-attention-tune-cache", "version": 1, "fingerprint": "fp", "entries": [)" + entries + "]}";
  };
  auto replace = [&](std::string from, std::string to) {
    std::string e = entry_ok;
    e.replace(e.find(from), from.size(), to);
    return doc(entry_ok + ", " + e);
  };
  const struct {
    std::string text, expected;
  } cases[] = {
      {"{not json", "is not valid"},
      {"[1, 2]", "expected a JSON object at the top level"},
      {R"({"format": "other", "version": 1})", "field 'format' must be \"cubevec-attention-tune-cache\""},
      {R"({"format": "cubevec-attention-tune-cache", "version": 1, "fingerprint": "fp"})", "field 'entries' must be an array"},
      {replace("\"flash\"", "\"laser\""), "entry 1: unknown attention op_type 'laser'"},
      {replace("\"flash\"", "\"flash_int8\""), "entry 1: field 'op_type' flash_int8 is lossy and never a tuned choice"},
      // A NUL shown escaped: the message goes on to the accepted names.
      {replace("\"flash\"", "\"flash\\u0000x\""), "entry 1: unknown attention op_type 'flash\\x00x' (expected one of: math,"},
      {replace("\"heads\": 2", "\"heads\": -2"), "entry 1: field 'heads' must be a positive integer"},
      {replace("\"heads\": 2", "\"heads\": 0"), "entry 1: field 'heads' must be a positive integer"},
      {replace("\"q_len\": 9", "\"q_len\": 0"), "entry 1: field 'q_len' must be a positive integer"},
      {replace("\"q_len\": 9", "\"q_len\": 9223372036854775808"),
       "entry 1: field 'q_len' must be a positive integer below 2^63, got 9223372036854775808"},
      {replace("\"heads\": 2", "\"heads\": \"2\""), "entry 1: field 'heads' must be a positive integer below 2^63, got \"2\""},
      {replace("\"seconds\": 0.1", "\"seconds\": 0.2"), "entry 1 repeats the key of entry 0 (B1 N2 D8 Sq9 Sk9 f32 BSND mask none)"},
      {replace("\"dtype\": \"f32\"", "\"dtype\": \"i8\""), "entry 1: field 'dtype' must be f32 or bf16"},
      {replace("\"kernel_layout\": \"BNSD\"", "\"kernel_layout\": \"BSH\""), "entry 1: field 'kernel_layout' must be BSND or BNSD"},
      {replace("\"mask\": \"none\"", "\"mask\": \"3d\""), "entry 1: unknown mask kind '3d'"},
      {replace("\"seconds\": 0.1", "\"seconds\": \"fast\""), "entry 1: field 'seconds' must be a non-negative number"},
      {doc(entry_ok + ", 5"), "entry 1: must be an object"},
      {R"({"format": "cubevec-attention-tune-cache", "format": "x"})", "is not valid"},
  };
  for (const auto& c : cases) {
    write_text(path, c.text);
    const std::string message = message_of([&] { AttentionTuner::global().load(path, "fp"); });
    EXPECT_NE(message.find("attention tune cache " + path), std::string::npos) << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << "got: " << message << "\nexpected: " << c.expected;
    EXPECT_TRUE(AttentionTuner::global().entries().empty()) << "a bad file must load nothing: " << c.expected;
  }
  std::filesystem::remove(path);
}

TEST_F(AttentionTunerTest, TheTableKeepsAtMostItsLimitDroppingTheOldest) {
  for (int64_t i = 0; i < static_cast<int64_t>(AttentionTuner::kMaxEntries) + 3; ++i)
    AttentionTuner::global().store({1, 1, 8, i + 1, 9, DType::f32, AttentionLayout::bsnd, ops::AttentionMaskKind::none},
                                   {AttentionImpl::flash, AttentionLayout::bnsd, 0.1});
  EXPECT_EQ(AttentionTuner::global().entries().size(), AttentionTuner::kMaxEntries);
  EXPECT_FALSE(AttentionTuner::global().find({1, 1, 8, 1, 9, DType::f32, AttentionLayout::bsnd, ops::AttentionMaskKind::none}));
  EXPECT_TRUE(AttentionTuner::global().find({1, 1, 8, 4, 9, DType::f32, AttentionLayout::bsnd, ops::AttentionMaskKind::none}));
}

}  // namespace attention_tuner_test
}  // namespace cubevec
