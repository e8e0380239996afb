// CLIP's tokenizer against goldens from tests/reference/make_clip_tokenizer_goldens.py (a Python
// transcription of transformers' slow CLIPTokenizer without ftfy, on Python's Unicode and the
// `regex` module) with openai's real vocabulary and merges (tests/data/clip_tokenizer, built by
// make_clip_tokenizer.py from bpe_simple_vocab_16e6.txt.gz); the ids the issue names; and the
// errors for bad folders and prompts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/strict_json.h"
#include "tokenizers/clip_tokenizer.h"

namespace clip_tokenizer_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;
using cubevec::tokenizers::ClipTokenizer;

const std::string kData = std::string(CUBEVEC_SOURCE_DIR) + "/tests/data";

const ClipTokenizer& clip() {
  static const ClipTokenizer tokenizer = ClipTokenizer::load(kData + "/clip_tokenizer");
  return tokenizer;
}

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const cubevec::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ClipTokenizer, TheWellKnownIds) {
  // The issue's ids, and transformers' printed output for "hello world" (PR #39821).
  std::vector<int32_t> cat = clip().encode_padded("a photo of a cat");
  ASSERT_EQ(cat.size(), 77u);
  EXPECT_EQ(std::vector<int32_t>(cat.begin(), cat.begin() + 7), (std::vector<int32_t>{49406, 320, 1125, 539, 320, 2368, 49407}));
  for (std::size_t i = 7; i < 77; ++i) EXPECT_EQ(cat[i], 49407) << "padding with <|endoftext|> at " << i;
  EXPECT_EQ(clip().encode("hello world"), (std::vector<int32_t>{3306, 1002}));
  EXPECT_EQ(clip().vocab_size(), 49408u);
  EXPECT_EQ(clip().model_max_length(), 77);
}

TEST(ClipTokenizer, MatchesTheReferenceTranscription) {
  const nlohmann::json goldens = cubevec::read_json_file(kData + "/clip_tokenizer_goldens.json");
  ASSERT_GE(goldens["cases"].size(), 15u);
  for (const auto& c : goldens["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    EXPECT_EQ(clip().encode(prompt), c["ids"].get<std::vector<int32_t>>()) << "prompt: " << prompt;
    EXPECT_EQ(clip().encode_padded(prompt, 77), c["padded_77"].get<std::vector<int32_t>>()) << "prompt: " << prompt;
  }
}

TEST(ClipTokenizer, TruncatesToTheMaximumLength) {
  std::string long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt += "cat ";
  const std::vector<int32_t> ids = clip().encode_padded(long_prompt, 10);
  EXPECT_EQ(ids, (std::vector<int32_t>{49406, 2368, 2368, 2368, 2368, 2368, 2368, 2368, 2368, 49407}));
  EXPECT_NE(error_of([] { clip().encode_padded("a", 1); }).find("the maximum length must be at least 2"), std::string::npos);
}

TEST(ClipTokenizer, InvalidUtf8IsNamed) {
  EXPECT_NE(error_of([] { clip().encode("caf\xe9", "--prompt"); }).find("--prompt: invalid UTF-8 at byte 3"), std::string::npos);
  EXPECT_NE(error_of([] { clip().encode("\xed\xa0\x80", "--prompt"); }).find("invalid UTF-8 at byte 0"), std::string::npos)
      << "a UTF-16 surrogate is not UTF-8";
  EXPECT_NE(error_of([] { clip().encode("\xc0\xaf"); }).find("invalid UTF-8 at byte 0"), std::string::npos) << "overlong";
}

TEST(ClipTokenizer, BadFoldersNameTheFile) {
  const fs::path dir = fs::temp_directory_path() / ("cubevec_clip_tok_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_NE(error_of([&] { ClipTokenizer::load(dir.string()); }).find("not a CLIP tokenizer folder (expected vocab.json and merges.txt"),
            std::string::npos);
  std::ofstream(dir / "vocab.json") << R"({"a": 0, "b": 1, "ab": 2})";
  std::ofstream(dir / "merges.txt") << "#version: 0.2\na b\n";
  EXPECT_NE(error_of([&] { ClipTokenizer::load(dir.string()); }).find("vocab.json: has no '<|startoftext|>'"), std::string::npos);
  std::ofstream(dir / "vocab.json", std::ios::trunc) << R"({"a": 0, "b": 1, "ab": 2, "<|startoftext|>": 3, "<|endoftext|>": 4})";
  std::ofstream(dir / "merges.txt", std::ios::trunc) << "#version: 0.2\na b\nab  c\n";
  EXPECT_NE(error_of([&] { ClipTokenizer::load(dir.string()); }).find("merges.txt: line 3 must be two symbols separated by one space"),
            std::string::npos);
  std::ofstream(dir / "merges.txt", std::ios::trunc) << "#version: 0.2\nb a\n";
  EXPECT_NE(error_of([&] { ClipTokenizer::load(dir.string()); }).find("line 2 merges into 'ba', which vocab.json does not have"),
            std::string::npos);
  std::ofstream(dir / "vocab.json", std::ios::trunc) << R"({"a": -1})";
  EXPECT_NE(error_of([&] { ClipTokenizer::load(dir.string()); }).find("the id of 'a' must be a non-negative integer, got -1"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace clip_tokenizer_test
