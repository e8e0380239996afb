// `cubevec inspect`, run as a separate process: listings of the shipped examples, the --json report,
// and the command-line contract for failures (exit 1, exactly one "error: ..." line on stderr).
#include "cli/run_cubevec.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace inspect_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;

const std::string kExamples = CUBEVEC_SOURCE_DIR "/assets/examples";
const std::string kSingle = kExamples + "/tiny_dit.safetensors";
const std::string kShardDir = kExamples + "/sharded";
const std::string kIndex = kShardDir + "/model.safetensors.index.json";

struct ExpectedTensor {
  std::string name, dtype;
  std::vector<uint64_t> shape;
  uint64_t itemsize;
  std::string shard;  // file name in the sharded example
};

// What assets/examples/make_examples.py writes (see its README), restated independently.
const std::vector<ExpectedTensor> kTensors = {
    {"x_embedder.weight", "F32", {32, 16}, 4, "model-00001-of-00002.safetensors"},
    {"x_embedder.bias", "F32", {32}, 4, "model-00001-of-00002.safetensors"},
    {"time_text_embed.timestep_embedder.linear_1.weight", "F16", {32, 16}, 2, "model-00001-of-00002.safetensors"},
    {"time_text_embed.timestep_embedder.linear_1.bias", "F16", {32}, 2, "model-00001-of-00002.safetensors"},
    {"transformer_blocks.0.norm1.linear.weight", "BF16", {192, 32}, 2, "model-00002-of-00002.safetensors"},
    {"transformer_blocks.0.norm1.linear.bias", "BF16", {192}, 2, "model-00002-of-00002.safetensors"},
    {"transformer_blocks.0.attn.to_q.weight", "BF16", {32, 32}, 2, "model-00002-of-00002.safetensors"},
    {"transformer_blocks.0.attn.to_q.bias", "BF16", {32}, 2, "model-00002-of-00002.safetensors"},
    {"transformer_blocks.0.attn.norm_q.weight", "F32", {8}, 4, "model-00002-of-00002.safetensors"},
    {"pos_embed.ids", "I64", {16, 3}, 8, "model-00001-of-00002.safetensors"},
    {"logit_scale", "F32", {}, 4, "model-00001-of-00002.safetensors"},
};

uint64_t numel(const std::vector<uint64_t>& shape) {
  uint64_t n = 1;
  for (uint64_t size : shape) n *= size;
  return n;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The table row for `name`: the line whose first column is exactly `name`.
std::string row_of(const std::string& stdout_text, const std::string& name) {
  for (const std::string& line : lines_of(stdout_text))
    if (line.rfind(name + " ", 0) == 0) return line;
  return "";
}

std::vector<std::string> words_of(const std::string& line) {
  std::vector<std::string> words;
  std::istringstream in(line);
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

using InspectCli = cubevec_cli_test::CliTest;
using cubevec_cli_test::Process;
using cubevec_cli_test::read_file;

// The failure contract: exit 1, nothing on stdout, exactly one line on stderr beginning `prefix`.
void expect_one_error_line(const Process& run, const std::string& prefix) {
  EXPECT_EQ(run.status, 1) << run.err;
  EXPECT_EQ(run.out, "");
  ASSERT_FALSE(run.err.empty());
  EXPECT_EQ(run.err.back(), '\n') << run.err;
  EXPECT_EQ(lines_of(run.err).size(), 1u) << run.err;
  EXPECT_EQ(run.err.rfind(prefix, 0), 0u) << "stderr does not start with '" << prefix << "': " << run.err;
}

std::string with_commas(uint64_t value) {
  std::string digits = std::to_string(value);
  for (std::size_t i = digits.size(); i > 3; i -= 3) digits.insert(i - 3, ",");
  return digits;
}

// "total: 11 tensors (BF16 4, F16 2, F32 4, I64 1), 8,537 elements, 18,468 bytes of tensor data"
std::string expected_total_line() {
  std::map<std::string, int> count;
  uint64_t elements = 0, bytes = 0;
  for (const auto& t : kTensors) {
    count[t.dtype] += 1;
    elements += numel(t.shape);
    bytes += numel(t.shape) * t.itemsize;
  }
  std::string dtypes;
  for (const auto& [dtype, n] : count) dtypes += (dtypes.empty() ? "" : ", ") + dtype + " " + std::to_string(n);
  return "total: " + std::to_string(kTensors.size()) + " tensors (" + dtypes + "), " + with_commas(elements) + " elements, " +
         with_commas(bytes) + " bytes of tensor data";
}

TEST_F(InspectCli, ListsEveryTensorOfTheExampleFile) {
  const Process r = run({"inspect", kSingle});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("metadata format = pt"), std::string::npos) << r.out;
  for (const auto& t : kTensors) {
    const std::string row = row_of(r.out, t.name);
    ASSERT_FALSE(row.empty()) << t.name << " missing from:\n" << r.out;
    const std::vector<std::string> words = words_of(row);
    ASSERT_GE(words.size(), 3u) << row;
    EXPECT_EQ(words[1], t.dtype) << row;
    EXPECT_NE(row.find("  " + shape_text(t.shape) + " "), std::string::npos) << row;
    EXPECT_NE(row.find(" " + with_commas(numel(t.shape) * t.itemsize) + " "), std::string::npos) << row;
    EXPECT_EQ(row.find(".safetensors"), std::string::npos) << "a single file has no shard column: " << row;
  }
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), expected_total_line());
}

TEST_F(InspectCli, ShardedIndexHasAShardColumn) {
  for (const std::string& target : {kIndex, kShardDir}) {
    SCOPED_TRACE(target);
    const Process r = run({"inspect", target});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_EQ(words_of(row_of(r.out, "name")), (std::vector<std::string>{"name", "dtype", "shape", "bytes", "offset", "shard"}));
    for (const auto& t : kTensors) {
      const std::vector<std::string> words = words_of(row_of(r.out, t.name));
      ASSERT_GE(words.size(), 3u) << t.name << " missing from:\n" << r.out;
      EXPECT_EQ(words[1], t.dtype) << t.name;
      EXPECT_EQ(words.back(), t.shard) << t.name;
    }
    EXPECT_EQ(lines_of(r.out).back(), expected_total_line());
  }
}

TEST_F(InspectCli, JsonReportMatchesTheFile) {
  const std::string json_path = (dir_ / "report.json").string();
  const Process r = run({"inspect", kSingle, "--json", json_path});
  ASSERT_EQ(r.status, 0) << r.err;
  nlohmann::json report;
  ASSERT_NO_THROW(report = nlohmann::json::parse(read_file(json_path))) << read_file(json_path);
  EXPECT_EQ(report["path"], kSingle);
  ASSERT_EQ(report["shards"].size(), 1u);
  EXPECT_EQ(report["shards"][0]["file_size"], fs::file_size(kSingle));
  EXPECT_EQ(report["shards"][0]["metadata"], nlohmann::json({{"format", "pt"}}));
  ASSERT_EQ(report["tensors"].size(), kTensors.size());
  uint64_t offset = 0, bytes = 0, elements = 0;
  for (const auto& listed : report["tensors"]) {  // in data order: contiguous from 0
    const std::string name = listed["name"];
    const auto it = std::find_if(kTensors.begin(), kTensors.end(), [&](const auto& t) { return t.name == name; });
    ASSERT_NE(it, kTensors.end()) << "unexpected tensor " << name;
    EXPECT_EQ(listed["dtype"], it->dtype) << name;
    EXPECT_EQ(listed["shape"].get<std::vector<uint64_t>>(), it->shape) << name;
    EXPECT_EQ(listed["bytes"], numel(it->shape) * it->itemsize) << name;
    EXPECT_EQ(listed["offset"], offset) << name;
    EXPECT_EQ(listed["shard"], "tiny_dit.safetensors") << name;
    offset += numel(it->shape) * it->itemsize;
    bytes += numel(it->shape) * it->itemsize;
    elements += numel(it->shape);
  }
  EXPECT_EQ(report["total_tensors"], kTensors.size());
  EXPECT_EQ(report["total_bytes"], bytes);
  EXPECT_EQ(report["total_elements"], elements);
}

TEST_F(InspectCli, ControlCharactersInNamesAreEscaped) {
  // A name with a terminal escape sequence and a metadata value with a newline, written by hand.
  const std::string json =
      "{\"__metadata__\":{\"note\":\"two\\nlines\"},\"red\\u001b[31m\\\\x\":"
      "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((json.size() >> (8 * i)) & 0xff));
  bytes += json + "A";
  const std::string path = (dir_ / "escapes.safetensors").string();
  std::ofstream(path, std::ios::binary) << bytes;
  const Process r = run({"inspect", path});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << "no raw escape reaches the terminal";
  EXPECT_NE(r.out.find("red\\x1b[31m\\\\x"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("metadata note = two\\x0alines"), std::string::npos) << r.out;
}

TEST_F(InspectCli, TruncatedFileIsOneErrorLineNamingIt) {
  const std::string bad = (dir_ / "truncated.safetensors").string();
  fs::copy_file(kSingle, bad);
  fs::resize_file(bad, fs::file_size(bad) - 100);  // the last tensor loses 100 bytes
  const Process r = run({"inspect", bad});
  expect_one_error_line(r, "error: " + bad + ": ");
  EXPECT_NE(r.err.find("[IncompleteBuffer]"), std::string::npos) << r.err;
}

TEST_F(InspectCli, TooShortFileIsOneErrorLineNamingIt) {
  const std::string bad = (dir_ / "short.safetensors").string();
  std::ofstream(bad, std::ios::binary) << "abc";
  const Process r = run({"inspect", bad});
  expect_one_error_line(r, "error: " + bad + ": ");
  EXPECT_NE(r.err.find("[HeaderTooSmall]"), std::string::npos) << r.err;
}

TEST_F(InspectCli, BadShardInIndexNamesTheShard) {
  for (const char* shard : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"})
    fs::copy_file(kShardDir + "/" + shard, dir_ / shard);
  fs::copy_file(kIndex, dir_ / "model.safetensors.index.json");
  const std::string bad = (dir_ / "model-00002-of-00002.safetensors").string();
  fs::resize_file(bad, fs::file_size(bad) - 1);
  const Process r = run({"inspect", dir_.string()});
  expect_one_error_line(r, "error: " + bad + ": ");
}

TEST_F(InspectCli, MissingFileIsOneErrorLine) {
  const std::string missing = (dir_ / "absent.safetensors").string();
  const Process r = run({"inspect", missing});
  expect_one_error_line(r, "error: " + missing + ": ");
  EXPECT_NE(r.err.find("cannot open"), std::string::npos) << r.err;
}

TEST_F(InspectCli, UnwritableJsonPathIsOneErrorLine) {
  const std::string json_path = (dir_ / "no_such_dir" / "report.json").string();
  const Process r = run({"inspect", kSingle, "--json", json_path});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
  EXPECT_EQ(r.err.rfind("error: --json: " + json_path + ": the directory ", 0), 0u) << r.err;
}

TEST_F(InspectCli, NoArgumentsIsAnError) {
  const Process r = run({});
  expect_one_error_line(r, "error: ");
  EXPECT_NE(r.err.find("subcommand"), std::string::npos) << r.err;
}

TEST_F(InspectCli, UnknownSubcommandIsAnError) {
  expect_one_error_line(run({"frobnicate"}), "error: unknown command 'frobnicate' (expected one of: inspect, ");
}

TEST_F(InspectCli, UnknownOptionIsAnError) {
  const Process r = run({"inspect", "--bogus", kSingle});
  expect_one_error_line(r, "error: ");
  EXPECT_NE(r.err.find("--bogus"), std::string::npos) << r.err;
}

TEST_F(InspectCli, InspectWithoutPathIsAnError) {
  const Process r = run({"inspect"});
  expect_one_error_line(r, "error: ");
  EXPECT_NE(r.err.find("path"), std::string::npos) << r.err;
}

TEST_F(InspectCli, HelpExitsZero) {
  const Process top = run({"--help"});
  EXPECT_EQ(top.status, 0) << top.err;
  EXPECT_NE(top.out.find("inspect"), std::string::npos) << top.out;
  const Process sub = run({"inspect", "--help"});
  EXPECT_EQ(sub.status, 0) << sub.err;
  EXPECT_NE(sub.out.find("--json"), std::string::npos) << sub.out;
}

}  // namespace inspect_test
