// The malformed-file corpus: each case breaks one rule of the format and must fail with that rule,
// a message naming the file (and the tensor, where there is one), and no out-of-bounds read.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include "tensor/safetensors.h"

namespace cubevec {
namespace safetensors_malformed_test {  // named after the file: unity batches never mix two files' helpers

// 8-byte little-endian length (the JSON's own unless `declared` is given), the JSON, then `data`.
std::string file_bytes(const std::string& json, const std::string& data = "", std::optional<uint64_t> declared = {}) {
  const uint64_t n = declared.value_or(json.size());
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return bytes + json + data;
}

struct Malformed {
  std::string case_name;
  std::string bytes;
  SafetensorsRule rule;
  std::string tensor;    // expected SafetensorsError::tensor(), "" when not about one tensor
  std::string fragment;  // must appear in the message
};

void PrintTo(const Malformed& c, std::ostream* out) { *out << c.case_name; }

std::string f32_entry(const std::string& shape, uint64_t begin, uint64_t end) {
  return R"({"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[)" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

std::vector<Malformed> corpus() {
  const std::string eight(8, '\0');
  return {
      {"EmptyFile", "", SafetensorsRule::HeaderTooSmall, "", "0 bytes"},
      {"SevenBytes", std::string(7, '\x01'), SafetensorsRule::HeaderTooSmall, "", "7 bytes"},
      {"HeaderOver100MB", file_bytes("{}", "", 100'000'001), SafetensorsRule::HeaderTooLarge, "", "100000001"},
      {"HeaderLengthMaxU64", file_bytes("{}", "", UINT64_MAX), SafetensorsRule::HeaderTooLarge, "", "18446744073709551615"},
      {"HeaderPastEnd", file_bytes("{}", "", 50), SafetensorsRule::InvalidHeaderLength, "", "runs past the end"},
      {"NotUtf8", file_bytes("{\"a\xff\":1}"), SafetensorsRule::InvalidUtf8, "", "not valid UTF-8"},
      {"OverlongUtf8", file_bytes("{\"\xc0\xaf\":1}"), SafetensorsRule::InvalidUtf8, "", "not valid UTF-8"},
      {"TruncatedJson", file_bytes("{\"x\":{\"dtype\":"), SafetensorsRule::InvalidJson, "", "not valid JSON"},
      {"TrailingGarbage", file_bytes("{} x"), SafetensorsRule::InvalidJson, "", "not valid JSON"},
      {"TopLevelArray", file_bytes("[1,2]"), SafetensorsRule::InvalidJson, "", "expected an object"},
      {"DeepNesting", file_bytes("{\"x\":{\"shape\":[[[[1]]]]}}"), SafetensorsRule::InvalidJson, "", "nests deeper"},
      {"MetadataNotObject", file_bytes(R"({"__metadata__":"pt"})"), SafetensorsRule::InvalidMetadata, "", "expected an object"},
      {"MetadataValueNotString", file_bytes(R"({"__metadata__":{"format":1}})"), SafetensorsRule::InvalidMetadata, "",
       "key 'format' holds a JSON number"},
      {"EntryNotObject", file_bytes(R"({"w":[1]})"), SafetensorsRule::InvalidEntry, "w", "expected an object"},
      {"MissingDtype", file_bytes(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "abcd"), SafetensorsRule::InvalidEntry, "w",
       "missing field 'dtype'"},
      {"MissingOffsets", file_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", "abcd"), SafetensorsRule::InvalidEntry, "w",
       "missing field 'data_offsets'"},
      {"UnknownDtype", file_bytes(R"({"w":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})", "abcd"), SafetensorsRule::UnknownDtype, "w",
       "unknown dtype 'F31'"},
      {"LowerCaseDtype", file_bytes(R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", "abcd"), SafetensorsRule::UnknownDtype,
       "w", "unknown dtype 'f32'"},
      {"DtypeNotString", file_bytes(R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", "abcd"), SafetensorsRule::UnknownDtype, "w",
       "expected a string"},
      {"NegativeShape", file_bytes(R"({"w":)" + f32_entry("[-1]", 0, 4) + "}", "abcd"), SafetensorsRule::InvalidShape, "w",
       "expected non-negative integers"},
      {"FloatShape", file_bytes(R"({"w":)" + f32_entry("[1.0]", 0, 4) + "}", "abcd"), SafetensorsRule::InvalidShape, "w", "holds 1.0"},
      {"HugeShapeNumber", file_bytes(R"({"w":)" + f32_entry("[99999999999999999999999]", 0, 4) + "}", "abcd"),
       SafetensorsRule::InvalidShape, "w", "expected non-negative integers"},
      {"ShapeNotArray", file_bytes(R"({"w":)" + f32_entry("4", 0, 4) + "}", "abcd"), SafetensorsRule::InvalidShape, "w",
       "expected an array"},
      {"ThreeOffsets", file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", "abcd"), SafetensorsRule::InvalidOffsets,
       "w", "expected [BEGIN, END]"},
      {"NegativeOffset", file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "abcd"), SafetensorsRule::InvalidOffsets,
       "w", "non-negative"},
      {"DuplicateName", file_bytes(R"({"w":)" + f32_entry("[1]", 0, 4) + R"(,"w":)" + f32_entry("[1]", 4, 8) + "}", eight),
       SafetensorsRule::DuplicateName, "", "'w' appears more than once"},
      // The JSON parser would stop at the NUL and never see what follows it (found by the fuzzer).
      {"NulInHeader", file_bytes(R"({"w":)" + f32_entry("[1]", 0, 4) + std::string("}\0   ", 5), "abcd"), SafetensorsRule::InvalidJson, "",
       "a NUL byte at offset"},
      {"DuplicateField", file_bytes(R"({"w":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", "abcd"),
       SafetensorsRule::InvalidJson, "", "'dtype' appears more than once"},
      {"FirstNotAtZero", file_bytes(R"({"w":)" + f32_entry("[1]", 4, 8) + "}", eight), SafetensorsRule::InvalidOffset, "w",
       "should begin at 0"},
      {"Gap", file_bytes(R"({"a":)" + f32_entry("[1]", 0, 4) + R"(,"b":)" + f32_entry("[1]", 8, 12) + "}", std::string(12, 'x')),
       SafetensorsRule::InvalidOffset, "b", "leaves a gap"},
      {"Overlap", file_bytes(R"({"a":)" + f32_entry("[2]", 0, 8) + R"(,"b":)" + f32_entry("[1]", 4, 8) + "}", eight),
       SafetensorsRule::InvalidOffset, "b", "overlaps"},
      {"EndBeforeBegin", file_bytes(R"({"a":)" + f32_entry("[1]", 0, 4) + R"(,"b":)" + f32_entry("[0]", 4, 2) + "}", "abcd"),
       SafetensorsRule::InvalidOffset, "b", "ends before it begins"},
      {"EmptySpanForNonEmptyShape", file_bytes(R"({"b":)" + f32_entry("[1]", 0, 0) + "}"), SafetensorsRule::TensorInvalidInfo, "b",
       "span 0 bytes, but 1 elements of F32 need 4"},
      {"ElementCountOverflow", file_bytes(R"({"w":)" + f32_entry("[4294967296,4294967296,2]", 0, 4) + "}", "abcd"),
       SafetensorsRule::ValidationOverflow, "w", "element count"},
      {"BitCountOverflow", file_bytes(R"({"w":)" + f32_entry("[1152921504606846976]", 0, 4) + "}", "abcd"),
       SafetensorsRule::ValidationOverflow, "w", "bits overflows"},
      {"F4OddCount", file_bytes(R"({"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", "ab"), SafetensorsRule::MisalignedSlice, "w",
       "do not fill whole bytes"},
      {"SpanTooShortForShape", file_bytes(R"({"w":)" + f32_entry("[1000,1000]", 0, 4) + "}", "abcd"), SafetensorsRule::TensorInvalidInfo,
       "w", "1000000 elements of F32 need 4000000"},
      {"HugeDeclaredTensor", file_bytes(R"({"w":)" + f32_entry("[288230376151711744]", 0, 1152921504606846976ull) + "}", "abcd"),
       SafetensorsRule::IncompleteBuffer, "", "cover 1152921504606846976 data bytes but the file holds 4"},
      {"TruncatedData", file_bytes(R"({"w":)" + f32_entry("[2]", 0, 8) + "}", "abcd"), SafetensorsRule::IncompleteBuffer, "",
       "cover 8 data bytes but the file holds 4"},
      {"TrailingBytes", file_bytes(R"({"w":)" + f32_entry("[1]", 0, 4) + "}", "abcdEXTRA"), SafetensorsRule::IncompleteBuffer, "",
       "the file holds 9"},
  };
}

class MalformedSafetensors : public ::testing::TestWithParam<Malformed> {};

TEST_P(MalformedSafetensors, FailsWithTheBrokenRule) {
  const Malformed& c = GetParam();
  const std::string path = (std::filesystem::temp_directory_path() / ("cubevec_malformed_" + c.case_name + ".safetensors")).string();
  {
    std::ofstream out(path, std::ios::binary);
    out.write(c.bytes.data(), static_cast<std::streamsize>(c.bytes.size()));
  }
  try {
    SafetensorsFile::open(path);
    ADD_FAILURE() << c.case_name << ": the file was accepted";
  } catch (const SafetensorsError& e) {
    const std::string message = e.what();
    EXPECT_EQ(rule_name(e.rule()), rule_name(c.rule)) << message;
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << "message must start with the file: " << message;
    EXPECT_EQ(e.tensor(), c.tensor) << message;
    if (!c.tensor.empty()) {
      EXPECT_NE(message.find("tensor '" + c.tensor + "'"), std::string::npos) << message;
    }
    EXPECT_NE(message.find(c.fragment), std::string::npos) << "expected '" << c.fragment << "' in: " << message;
  }
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Corpus, MalformedSafetensors, ::testing::ValuesIn(corpus()),
                         [](const auto& param_info) { return param_info.param.case_name; });

TEST(MalformedSafetensors, CorpusCoversEveryRule) {
  std::set<SafetensorsRule> covered;
  for (const auto& c : corpus()) covered.insert(c.rule);
  EXPECT_EQ(covered.size(), 16u) << "every SafetensorsRule has at least one malformed file";
}

// Edge cases the format allows; a reader that rejects them breaks real files.
TEST(WellFormedSafetensors, EdgeCasesAreAccepted) {
  const auto parse = [](const std::string& bytes) {
    return parse_safetensors(std::span(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()), "edge");
  };
  EXPECT_TRUE(parse(file_bytes("{}")).entries.empty());
  EXPECT_TRUE(parse(file_bytes(" \t\r\n{}  \n")).entries.empty()) << "JSON whitespace around the object";
  EXPECT_TRUE(parse(file_bytes(R"({"__metadata__":null})")).metadata.empty());
  const auto scalar = parse(file_bytes(R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,8],"extra":[1,2]}})", "12345678"));
  ASSERT_EQ(scalar.entries.size(), 1u);
  EXPECT_TRUE(scalar.entries[0].shape.empty());
  const auto zero =
      parse(file_bytes(R"({"z":{"dtype":"BF16","shape":[0,5],"data_offsets":[0,0]},"a":)" + f32_entry("[1]", 0, 4) + "}", "abcd"));
  ASSERT_EQ(zero.entries.size(), 2u);
  const auto f4 = parse(file_bytes(R"({"q":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]}})", "abc"));
  EXPECT_EQ(f4.entries[0].end, 3u);
  const auto named = parse(file_bytes(R"({"blocks.0.attn.to_q.weight \u00e9":)" + f32_entry("[1]", 0, 4) + "}", "abcd"));
  EXPECT_EQ(named.entries[0].name, "blocks.0.attn.to_q.weight \xc3\xa9");
}

// parse_safetensors takes a one-pass path for well-formed headers and the strict DOM path for the
// rest: on every input of the corpus, the edge cases and some near misses both give the same header
// or the same error.
TEST(SafetensorsParsePaths, FastAndStrictAgreeOnEveryInput) {
  std::vector<std::string> inputs;
  for (const auto& c : corpus()) inputs.push_back(c.bytes);
  const std::string w = f32_entry("[1]", 0, 4);
  for (const std::string& json : {
           std::string("{}"),
           std::string(" \t{}\n"),
           std::string(R"({"__metadata__":null})"),
           std::string(R"({"__metadata__":{"format":"pt","b":"2"},"w":)") + w + "}",
           std::string(R"({"__metadata__":{"a":"1"},"__metadata__":{"b":"2"}})"),
           std::string(R"({"__metadata__":{"a":"1","a":"2"}})"),
           std::string(R"({"w":)") + w + R"(,"w":)" + w + "}",
           std::string(R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,8],"extra":[1,2]}})"),
           std::string(R"({"s":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})"),
           std::string(R"({"s":{"shape":[1],"data_offsets":[0,4],"dtype":"F32"}})"),
           std::string(R"({"s":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})"),
           std::string(R"({"s":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})"),
           std::string(R"({"s":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})"),
           std::string(R"({"s":{"dtype":"F32","shape":[1],"data_offsets":[0]}})"),
           std::string(R"({"s":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})"),
           std::string(
               R"({"z":{"dtype":"BF16","shape":[0],"data_offsets":[0,0]},"y":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"a":)") +
               w + "}",
           std::string(R"({"b":)") + f32_entry("[1]", 4, 8) + R"(,"a":)" + w + "}",
           std::string(R"({"b":)") + f32_entry("[1]", 2, 6) + R"(,"a":)" + w + "}",
       }) {
    for (const char* data : {"", "abcd", "abcdefgh"}) inputs.push_back(file_bytes(json, data));
  }
  const auto outcome = [](const std::string& bytes, bool strict) {
    const std::span<const std::byte> span(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
    try {
      const SafetensorsHeader h = strict ? parse_safetensors_strict(span, "f") : parse_safetensors(span, "f");
      std::string text = std::to_string(h.header_length) + " " + std::to_string(h.data_start);
      for (const auto& e : h.entries) {
        text += " | " + e.name + " " + std::string(e.dtype->name) + " [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")";
        for (uint64_t d : e.shape) text += " " + std::to_string(d);
      }
      for (const auto& [k, v] : h.metadata) text += " | " + k + "=" + v;
      return text;
    } catch (const SafetensorsError& e) {
      return std::string("error ") + e.what();
    }
  };
  int accepted = 0;
  for (const std::string& bytes : inputs) {
    const std::string strict = outcome(bytes, true);
    EXPECT_EQ(outcome(bytes, false), strict);
    accepted += strict.rfind("error", 0) != 0;
  }
  EXPECT_GE(accepted, 8) << "the comparison covers accepted headers too";
}

}  // namespace safetensors_malformed_test
}  // namespace cubevec
