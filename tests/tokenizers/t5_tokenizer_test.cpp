// T5's tokenizer against goldens from tests/reference/make_t5_tokenizer.py: a small Unigram model
// trained by Debian's python3-sentencepiece (T5's special ids, nmt_nfkc) and the ids a
// transcription of transformers' slow T5Tokenizer gives (special tokens typed in the prompt,
// <extra_id_N> with the whitespace around it, </s>, truncation and padding with the mask); and
// the errors for bad folders and prompts.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/strict_json.h"
#include "tokenizers/t5_tokenizer.h"

namespace t5_tokenizer_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;
using cubevec::tokenizers::T5Tokenizer;

const std::string kData = std::string(CUBEVEC_SOURCE_DIR) + "/tests/data";

const T5Tokenizer& t5() {
  static const T5Tokenizer tokenizer = T5Tokenizer::load(kData + "/t5_tokenizer");
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

TEST(T5Tokenizer, SpecialIdsAsT5Has) {
  EXPECT_EQ(t5().pad_id(), 0);
  EXPECT_EQ(t5().eos_id(), 1);
  EXPECT_EQ(t5().unk_id(), 2);
  EXPECT_EQ(t5().vocab_size(), 700);  // 600 pieces + 100 extra ids
  EXPECT_EQ(t5().extra_id(0), 699);
  EXPECT_EQ(t5().extra_id(99), 600);
}

TEST(T5Tokenizer, MatchesTheReferenceTranscription) {
  const nlohmann::json goldens = cubevec::read_json_file(kData + "/t5_tokenizer_goldens.json");
  ASSERT_GE(goldens["cases"].size(), 10u);
  for (const auto& c : goldens["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    EXPECT_EQ(t5().encode(prompt), c["ids"].get<std::vector<int32_t>>()) << "prompt: " << prompt;
    const cubevec::tokenizers::PaddedIds padded = t5().encode_padded(prompt, 16);
    EXPECT_EQ(padded.ids, c["padded_16"].get<std::vector<int32_t>>()) << "prompt: " << prompt;
    EXPECT_EQ(padded.attention_mask, c["mask_16"].get<std::vector<int32_t>>()) << "prompt: " << prompt;
  }
}

TEST(T5Tokenizer, EmptyPromptIsEosThenPadding) {
  // WanPipeline's negative prompt "" gives [1, 0 x 511] and a sequence length of 1.
  const cubevec::tokenizers::PaddedIds empty = t5().encode_padded("", 512);
  ASSERT_EQ(empty.ids.size(), 512u);
  EXPECT_EQ(empty.ids[0], 1);
  EXPECT_EQ(std::count(empty.ids.begin(), empty.ids.end(), 0), 511);
  EXPECT_EQ(std::count(empty.attention_mask.begin(), empty.attention_mask.end(), 1), 1);
}

TEST(T5Tokenizer, BadInputsNameTheFile) {
  EXPECT_NE(error_of([] { t5().encode("caf\xe9", "--prompt"); }).find("--prompt: invalid UTF-8 at byte 3"), std::string::npos);
  EXPECT_NE(error_of([] { t5().encode_padded("a", 0); }).find("the maximum length must be at least 1"), std::string::npos);
  const fs::path dir = fs::temp_directory_path() / ("cubevec_t5_tok_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_NE(error_of([&] { T5Tokenizer::load(dir.string()); }).find("not a T5 tokenizer folder (expected spiece.model or tokenizer.json)"),
            std::string::npos);
  std::ofstream(dir / "spiece.model") << "this is not a protobuf";
  EXPECT_NE(error_of([&] { T5Tokenizer::load(dir.string()); }).find("spiece.model: not a SentencePiece model"), std::string::npos);
  fs::copy_file(kData + "/t5_tokenizer/spiece.model", dir / "spiece.model", fs::copy_options::overwrite_existing);
  std::ofstream(dir / "tokenizer_config.json") << R"({"extra_ids": -3})";
  EXPECT_NE(error_of([&] { T5Tokenizer::load(dir.string()); }).find("'extra_ids' must be an integer from 0 to 100000, got -3"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace t5_tokenizer_test
