// Checkpoint: the shipped examples (one file, shards + index, directory) read back exactly the values
// of assets/examples/make_examples.py's formula; malformed indexes and directories fail with a message
// naming the input and the rule broken.
#include "tensor/checkpoint.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tensor/half.h"

namespace cubevec {
namespace checkpoint_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;

const std::string kExamples = CUBEVEC_SOURCE_DIR "/assets/examples";
const std::string kSingle = kExamples + "/tiny_dit.safetensors";
const std::string kShardDir = kExamples + "/sharded";
const std::string kIndex = kShardDir + "/model.safetensors.index.json";
const std::string kShard1 = "model-00001-of-00002.safetensors";
const std::string kShard2 = "model-00002-of-00002.safetensors";

struct ExpectedTensor {
  std::string name;
  std::string dtype;  // safetensors name
  std::vector<uint64_t> shape;
};

// Written out again here (not read from the script) so the test checks the files, not itself.
const std::vector<ExpectedTensor>& expected_tensors() {
  static const std::vector<ExpectedTensor> tensors = [] {
    std::vector<ExpectedTensor> list = {
        {"x_embedder.weight", "F32", {32, 16}},
        {"x_embedder.bias", "F32", {32}},
        {"time_text_embed.timestep_embedder.linear_1.weight", "F16", {32, 16}},
        {"time_text_embed.timestep_embedder.linear_1.bias", "F16", {32}},
        {"transformer_blocks.0.norm1.linear.weight", "BF16", {192, 32}},
        {"transformer_blocks.0.norm1.linear.bias", "BF16", {192}},
        {"transformer_blocks.0.attn.to_q.weight", "BF16", {32, 32}},
        {"transformer_blocks.0.attn.to_q.bias", "BF16", {32}},
        {"transformer_blocks.0.attn.norm_q.weight", "F32", {8}},
        {"pos_embed.ids", "I64", {16, 3}},
        {"logit_scale", "F32", {}},
    };
    // k in the formula is the position in name order.
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    return list;
  }();
  return tensors;
}

// The generator's formula: n = (i*37 + k*11) % 101 - 50; floats hold n / 64, integers n.
int64_t numerator(int64_t k, int64_t i) { return (i * 37 + k * 11) % 101 - 50; }

// Every element of `t` against the formula, decoding 16-bit floats with tensor/half.h.
void expect_formula_values(const Tensor& t, int64_t k, const std::string& name) {
  SCOPED_TRACE(name);
  ASSERT_TRUE(t.is_contiguous());
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t n = numerator(k, i);
    const float expected = static_cast<float>(n) / 64.0f;
    switch (t.dtype()) {
      case DType::f32: ASSERT_EQ(t.data<float>()[i], expected) << "element " << i; break;
      case DType::f16: ASSERT_EQ(f16_to_f32(t.data<uint16_t>()[i]), expected) << "element " << i; break;
      case DType::bf16: ASSERT_EQ(bf16_to_f32(t.data<uint16_t>()[i]), expected) << "element " << i; break;
      case DType::i64: ASSERT_EQ(t.data<int64_t>()[i], n) << "element " << i; break;
      default: FAIL() << "unexpected dtype " << dtype_name(t.dtype());
    }
  }
}

void expect_matches_formula(const Checkpoint& checkpoint) {
  std::vector<std::string> names;
  for (const auto& e : expected_tensors()) names.push_back(e.name);
  ASSERT_EQ(checkpoint.names(), names);
  for (std::size_t k = 0; k < expected_tensors().size(); ++k) {
    const ExpectedTensor& want = expected_tensors()[k];
    const SafetensorsEntry& entry = checkpoint.entry(want.name);
    EXPECT_EQ(entry.dtype->name, want.dtype) << want.name;
    EXPECT_EQ(entry.shape, want.shape) << want.name;
    const Tensor t = checkpoint.tensor(want.name);
    EXPECT_EQ(std::string(safetensors_dtype_name(t.dtype())), want.dtype) << want.name;
    ASSERT_EQ(t.dim(), static_cast<int64_t>(want.shape.size())) << want.name;
    for (std::size_t d = 0; d < want.shape.size(); ++d)
      EXPECT_EQ(t.size(static_cast<int64_t>(d)), static_cast<int64_t>(want.shape[d])) << want.name;
    expect_formula_values(t, static_cast<int64_t>(k), want.name);
  }
}

std::string file_name(const std::string& path) { return fs::path(path).filename().string(); }

TEST(CheckpointExamples, SingleFileHoldsTheFormulaValues) {
  const Checkpoint checkpoint = Checkpoint::open(kSingle);
  EXPECT_EQ(checkpoint.path(), kSingle);
  ASSERT_EQ(checkpoint.shards().size(), 1u);
  EXPECT_EQ(checkpoint.shards()[0].metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  expect_matches_formula(checkpoint);
}

// The reference writer's layout: descending dtype rank (I64 > F32 > BF16 > F16), then name, from
// offset 0 with no gaps; header length a multiple of 8.
TEST(CheckpointExamples, SingleFileHasTheReferenceWriterLayout) {
  const SafetensorsFile file = SafetensorsFile::open(kSingle);
  EXPECT_EQ(file.header_length() % 8, 0u);
  const std::vector<std::string> rank = {"F16", "BF16", "F32", "I64"};  // increasing alignment rank
  const auto rank_of = [&](const SafetensorsEntry& e) {
    return std::find(rank.begin(), rank.end(), std::string(e.dtype->name)) - rank.begin();
  };
  uint64_t offset = 0;
  for (std::size_t i = 0; i < file.entries().size(); ++i) {
    const SafetensorsEntry& e = file.entries()[i];
    EXPECT_EQ(e.begin, offset) << e.name;
    offset = e.end;
    if (i == 0) continue;
    const SafetensorsEntry& prev = file.entries()[i - 1];
    EXPECT_TRUE(rank_of(prev) > rank_of(e) || (rank_of(prev) == rank_of(e) && prev.name < e.name))
        << prev.name << " is laid out before " << e.name;
  }
  EXPECT_EQ(8 + file.header_length() + offset, file.file_size());
}

TEST(CheckpointExamples, ShardedIndexHoldsTheFormulaValues) {
  const Checkpoint checkpoint = Checkpoint::open(kIndex);
  EXPECT_EQ(checkpoint.path(), kIndex);
  ASSERT_EQ(checkpoint.shards().size(), 2u);
  expect_matches_formula(checkpoint);
  // Block tensors live in the second shard, the rest in the first.
  for (const auto& want : expected_tensors()) {
    const bool block = want.name.rfind("transformer_blocks.", 0) == 0;
    EXPECT_EQ(file_name(checkpoint.shard_of(want.name).path()), block ? kShard2 : kShard1) << want.name;
  }
}

TEST(CheckpointExamples, ShardedAndSingleGiveIdenticalTensors) {
  const Checkpoint single = Checkpoint::open(kSingle);
  const Checkpoint sharded = Checkpoint::open(kIndex);
  ASSERT_EQ(single.names(), sharded.names());
  for (const std::string& name : single.names()) {
    const Tensor a = single.tensor(name), b = sharded.tensor(name);
    EXPECT_EQ(a.dtype(), b.dtype()) << name;
    EXPECT_EQ(a.shape(), b.shape()) << name;
    ASSERT_EQ(a.nbytes(), b.nbytes()) << name;
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << name;
  }
}

// The index's total_size (not used by the reader) must still describe the shards it ships with.
TEST(CheckpointExamples, IndexTotalSizeIsTheSumOfTensorBytes) {
  std::ifstream in(kIndex);
  const nlohmann::json index = nlohmann::json::parse(in);
  const Checkpoint checkpoint = Checkpoint::open(kIndex);
  uint64_t total = 0;
  for (const std::string& name : checkpoint.names()) total += checkpoint.entry(name).end - checkpoint.entry(name).begin;
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(index["weight_map"].size(), expected_tensors().size());
}

TEST(CheckpointExamples, DirectoryWithAnIndexOpensTheIndex) {
  const Checkpoint checkpoint = Checkpoint::open(kShardDir);
  EXPECT_EQ(file_name(checkpoint.path()), "model.safetensors.index.json");
  ASSERT_EQ(checkpoint.shards().size(), 2u);
  expect_matches_formula(checkpoint);
}

TEST(CheckpointExamples, UnknownTensorNameIsNamedInTheError) {
  const Checkpoint checkpoint = Checkpoint::open(kIndex);
  EXPECT_FALSE(checkpoint.contains("proj_out.weight"));
  try {
    (void)checkpoint.tensor("proj_out.weight");
    FAIL() << "expected cubevec::Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(kIndex), std::string::npos) << message;
    EXPECT_NE(message.find("no tensor named 'proj_out.weight'"), std::string::npos) << message;
  }
}

// Malformed checkpoints, built in a fresh temporary directory per test.
class CheckpointErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "cubevec_checkpoint_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << "mkdtemp " << pattern << ": " << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A shard holding one small F32 tensor per name.
  std::string write_shard(const std::string& name, std::initializer_list<std::string> tensors) const {
    NamedTensors named;
    float value = 1.0f;
    for (const std::string& tensor : tensors) {
      named.emplace_back(tensor, Tensor::from_vector<float>({value, value + 0.5f}, {2}));
      value += 1.0f;
    }
    write_safetensors(path(name), named);
    return path(name);
  }

  std::string write_text(const std::string& name, const std::string& text) const {
    std::ofstream out(path(name), std::ios::binary);
    out << text;
    EXPECT_TRUE(out.good()) << "writing " << path(name);
    return path(name);
  }

  fs::path dir_;
};

// Opens `target` and expects a cubevec::Error whose message holds every fragment.
void expect_open_error(const std::string& target, std::initializer_list<std::string> fragments) {
  try {
    (void)Checkpoint::open(target);
    ADD_FAILURE() << target << ": opened, expected cubevec::Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos) << "missing '" << fragment << "' in: " << message;
  } catch (const std::exception& e) {
    ADD_FAILURE() << target << ": threw a non-cubevec exception: " << e.what();
  }
}

TEST_F(CheckpointErrors, IndexThatIsNotJson) {
  write_shard("a.safetensors", {"w"});
  const std::string index = write_text("model.safetensors.index.json", "{\"weight_map\": {\"w\": \"a.safetensors\"");
  expect_open_error(index, {index + ": ", "not valid JSON"});
}

TEST_F(CheckpointErrors, IndexWithoutWeightMap) {
  const std::string index = write_text("model.safetensors.index.json", R"({"metadata": {"total_size": 8}})");
  expect_open_error(index, {index + ": ", "\"weight_map\" object"});
}

TEST_F(CheckpointErrors, IndexWhoseWeightMapIsNotAnObject) {
  const std::string index = write_text("model.safetensors.index.json", R"({"weight_map": ["a.safetensors"]})");
  expect_open_error(index, {index + ": ", "\"weight_map\" object"});
}

TEST_F(CheckpointErrors, WeightMapValueThatIsNotAString) {
  const std::string index = write_text("model.safetensors.index.json", R"({"weight_map": {"w": 3}})");
  expect_open_error(index, {index + ": ", "weight_map entry 'w' is a JSON number, expected a file name"});
}

TEST_F(CheckpointErrors, ShardPathWithASlash) {
  fs::create_directory(dir_ / "sub");
  write_shard("sub/a.safetensors", {"w"});  // exists, so only the path rule can reject it
  const std::string index = write_text("model.safetensors.index.json", R"({"weight_map": {"w": "sub/a.safetensors"}})");
  expect_open_error(index, {index + ": ", "names shard 'sub/a.safetensors'", "plain file name"});
}

TEST_F(CheckpointErrors, ShardPathLeavingTheDirectory) {
  fs::create_directory(dir_ / "model");
  write_shard("outside.safetensors", {"w"});  // exists one level up
  const std::string index = write_text("model/model.safetensors.index.json", R"({"weight_map": {"w": "../outside.safetensors"}})");
  expect_open_error(index, {index + ": ", "names shard '../outside.safetensors'", "plain file name"});
}

TEST_F(CheckpointErrors, ShardPathThatIsDotDot) {
  const std::string index = write_text("model.safetensors.index.json", R"({"weight_map": {"w": ".."}})");
  expect_open_error(index, {index + ": ", "names shard '..'", "plain file name"});
}

TEST_F(CheckpointErrors, MissingShardFile) {
  const std::string index = write_text("model.safetensors.index.json", R"({"weight_map": {"w": "absent.safetensors"}})");
  expect_open_error(index, {index + ": weight_map puts tensor 'w' in shard " + path("absent.safetensors") + ", which does not exist"});
}

TEST_F(CheckpointErrors, MalformedShardIsNamed) {
  const std::string shard = write_shard("a.safetensors", {"w"});
  fs::resize_file(shard, fs::file_size(shard) - 1);  // cut the last data byte
  const std::string index = write_text("model.safetensors.index.json", R"({"weight_map": {"w": "a.safetensors"}})");
  expect_open_error(index, {shard + ": ", "[IncompleteBuffer]"});
}

TEST_F(CheckpointErrors, MappedNameAbsentFromItsShard) {
  write_shard("a.safetensors", {"w"});
  const std::string index =
      write_text("model.safetensors.index.json", R"({"weight_map": {"w": "a.safetensors", "ghost": "a.safetensors"}})");
  expect_open_error(index, {index + ": ", "puts tensor 'ghost' in a.safetensors, which has no such tensor"});
}

TEST_F(CheckpointErrors, ShardTensorMissingFromWeightMap) {
  const std::string shard = write_shard("a.safetensors", {"w", "extra"});
  const std::string index = write_text("model.safetensors.index.json", R"({"weight_map": {"w": "a.safetensors"}})");
  expect_open_error(index, {index + ": ", "shard " + shard + " holds tensor 'extra', which weight_map does not list"});
}

TEST_F(CheckpointErrors, TensorInTwoShards) {
  const std::string a = write_shard("a.safetensors", {"w", "shared"});
  const std::string b = write_shard("b.safetensors", {"shared", "x"});
  const std::string index = write_text("model.safetensors.index.json",
                                       R"({"weight_map": {"w": "a.safetensors", "shared": "a.safetensors", "x": "b.safetensors"}})");
  expect_open_error(index, {index + ": ", "tensor 'shared' is in two shards", a, b});
}

TEST_F(CheckpointErrors, DuplicateKeyInWeightMap) {
  write_shard("a.safetensors", {"w"});
  write_shard("b.safetensors", {"w"});
  const std::string index = write_text("model.safetensors.index.json", R"({"weight_map": {"w": "a.safetensors", "w": "b.safetensors"}})");
  expect_open_error(index, {index + ": ", "the key 'w' appears more than once"});
}

TEST_F(CheckpointErrors, DirectoryWithNoCheckpoint) {
  write_text("config.json", "{}");
  expect_open_error(dir_.string(), {dir_.string() + ": ", "holds no .safetensors file and no .safetensors.index.json"});
}

TEST_F(CheckpointErrors, DirectoryWithTwoSafetensorsFiles) {
  write_shard("a.safetensors", {"w"});
  write_shard("b.safetensors", {"w"});
  expect_open_error(dir_.string(),
                    {dir_.string() + ": ", "holds several *.safetensors files", "a.safetensors", "b.safetensors", "name the one to load"});
}

TEST_F(CheckpointErrors, DirectoryWithTwoIndexes) {
  write_text("a.safetensors.index.json", "{}");
  write_text("b.safetensors.index.json", "{}");
  expect_open_error(dir_.string(), {dir_.string() + ": ", "holds several *.safetensors.index.json files"});
}

// The positive counterpart of the two cases above: exactly one file is chosen.
TEST_F(CheckpointErrors, DirectoryWithOneSafetensorsFileOpensIt) {
  const std::string shard = write_shard("only.safetensors", {"w"});
  const Checkpoint checkpoint = Checkpoint::open(dir_.string());
  EXPECT_EQ(checkpoint.path(), shard);
  ASSERT_EQ(checkpoint.names(), std::vector<std::string>{"w"});
  EXPECT_EQ(checkpoint.tensor("w").at<float>({1}), 1.5f);
}

}  // namespace checkpoint_test
}  // namespace cubevec
