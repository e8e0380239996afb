// T5Tokenizer from a tokenizer.json folder (no spiece.model): tests/data/t5_tokenizer_json/ is the
// committed test model (tests/data/t5_tokenizer/spiece.model) converted as transformers'
// T5Converter does by tests/reference/make_t5_tokenizer.py. Every golden prompt must give the same
// ids as through spiece.model; the older normalizer / pre-tokenizer forms, written here to a
// temporary folder, give the same ids on the prompts they agree on; and each malformed file is an
// error naming it and what was expected.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/strict_json.h"
#include "tokenizers/t5_tokenizer.h"
#include "tokenizers/t5_tokenizer_json.h"

namespace t5_tokenizer_json_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;
using cubevec::tokenizers::T5Tokenizer;
using nlohmann::json;

const std::string kData = std::string(CUBEVEC_SOURCE_DIR) + "/tests/data";
const std::string kSpace = "\xe2\x96\x81";  // "▁"

const T5Tokenizer& t5_json() {
  static const T5Tokenizer tokenizer = T5Tokenizer::load(kData + "/t5_tokenizer_json");
  return tokenizer;
}

const json& base_json() {
  static const json j = cubevec::read_json_file(kData + "/t5_tokenizer_json/tokenizer.json");
  return j;
}

const json& goldens() {
  static const json g = cubevec::read_json_file(kData + "/t5_tokenizer_goldens.json");
  return g;
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

std::string base64(const std::string& bytes) {
  static const char* const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t group = 0;
    for (std::size_t k = 0; k < 3; ++k) group = group << 8 | (i + k < bytes.size() ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (std::size_t k = 0; k < 4; ++k) out += k <= bytes.size() - i ? alphabet[group >> (18 - 6 * k) & 63] : '=';
  }
  return out;
}

// A charsmap of 256 trie units, unit 0 = `root` and the rest 0, then the strings "a\0".
std::string charsmap_blob(uint32_t root) {
  std::string blob;
  const auto put = [&](uint32_t v) {
    for (int b = 0; b < 4; ++b) blob.push_back(static_cast<char>(v >> (8 * b) & 0xFF));
  };
  put(256 * 4);
  put(root);
  for (int i = 1; i < 256; ++i) put(0);
  blob += std::string("a\0", 2);
  return blob;
}

// A temporary tokenizer folder holding `tokenizer` as tokenizer.json (and nothing else).
class Folder {
 public:
  explicit Folder(const std::string& name)
      : dir_(fs::temp_directory_path() / ("cubevec_t5_json_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~Folder() { fs::remove_all(dir_); }
  Folder(const Folder&) = delete;
  Folder& operator=(const Folder&) = delete;
  void write(const std::string& file, const std::string& text) const { std::ofstream(dir_ / file, std::ios::binary) << text; }
  void write_json(const json& tokenizer) const { write("tokenizer.json", tokenizer.dump(1)); }
  std::string path() const { return dir_.string(); }
  std::string load_error() const {
    return error_of([&] { T5Tokenizer::load(path()); });
  }

 private:
  fs::path dir_;
};

// The error from loading the base tokenizer.json changed by `edit`.
std::string error_with(const std::string& name, const std::function<void(json&)>& edit) {
  json j = base_json();
  edit(j);
  const Folder folder(name);
  folder.write_json(j);
  return folder.load_error();
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << "message: " << (text)

// A prompt with no special token and no whitespace that SentencePiece's whitespace rules change.
bool plain(const std::string& prompt) {
  return !prompt.empty() && prompt.find('<') == std::string::npos && prompt.find("  ") == std::string::npos &&
         prompt.find_first_of("\t\n\r") == std::string::npos && prompt.front() != ' ' && prompt.back() != ' ';
}

bool ascii(const std::string& prompt) {
  for (const char c : prompt)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

// Checks the goldens that `which` selects against the tokenizer.json `tokenizer` (in a temporary
// folder called `name`); returns how many prompts were checked.
int expect_goldens(const std::string& name, const json& tokenizer, const std::function<bool(const std::string&)>& which) {
  const Folder folder(name);
  folder.write_json(tokenizer);
  const T5Tokenizer t = T5Tokenizer::load(folder.path());
  int checked = 0;
  for (const auto& c : goldens()["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    if (!which(prompt)) continue;
    EXPECT_EQ(t.encode(prompt), c["ids"].get<std::vector<int32_t>>()) << name << ", prompt: " << prompt;
    ++checked;
  }
  return checked;
}

TEST(T5TokenizerJson, SpecialIdsAsSpieceModel) {
  EXPECT_EQ(t5_json().pad_id(), 0);
  EXPECT_EQ(t5_json().eos_id(), 1);
  EXPECT_EQ(t5_json().unk_id(), 2);
  EXPECT_EQ(t5_json().vocab_size(), 700);  // 600 pieces + the 100 extra ids, here vocabulary entries
  EXPECT_EQ(t5_json().extra_id(0), 699);
  EXPECT_EQ(t5_json().extra_id(99), 600);
}

TEST(T5TokenizerJson, MatchesTheSpieceModelGoldens) {
  ASSERT_GE(goldens()["cases"].size(), 10u);
  for (const auto& c : goldens()["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    EXPECT_EQ(t5_json().encode(prompt), c["ids"].get<std::vector<int32_t>>()) << "prompt: " << prompt;
    const cubevec::tokenizers::PaddedIds padded = t5_json().encode_padded(prompt, 16);
    EXPECT_EQ(padded.ids, c["padded_16"].get<std::vector<int32_t>>()) << "prompt: " << prompt;
    EXPECT_EQ(padded.attention_mask, c["mask_16"].get<std::vector<int32_t>>()) << "prompt: " << prompt;
  }
  const cubevec::tokenizers::PaddedIds empty = t5_json().encode_padded("", 512);
  EXPECT_EQ(empty.ids[0], 1);
  EXPECT_EQ(std::count(empty.ids.begin(), empty.ids.end(), 0), 511);
}

TEST(T5TokenizerJson, WithoutTokenizerConfigTheExtraIdsAreTheVocabularyEntries) {
  const Folder folder("no_config");
  folder.write_json(base_json());
  const T5Tokenizer t = T5Tokenizer::load(folder.path());
  EXPECT_EQ(t.vocab_size(), 700);
  EXPECT_EQ(t.extra_id(0), 699);
  EXPECT_EQ(t.encode("fill <extra_id_0> the <extra_id_99>"), t5_json().encode("fill <extra_id_0> the <extra_id_99>"));
}

TEST(T5TokenizerJson, OlderNormalizerAndPreTokenizerForms) {
  const json precompiled = base_json()["normalizer"]["normalizers"][0];
  ASSERT_EQ(precompiled["type"], "Precompiled");
  const json metaspace_old = {{"type", "Metaspace"}, {"replacement", kSpace}, {"str_rep", kSpace}, {"add_prefix_space", true}};
  const auto all = [](const std::string&) { return true; };

  // t5-base's file (tokenizers 0.10-0.13): Precompiled alone, WhitespaceSplit then Metaspace.
  json j = base_json();
  j["normalizer"] = precompiled;
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "WhitespaceSplit"}}, metaspace_old}}};
  EXPECT_EQ(expect_goldens("whitespace_split", j, all), static_cast<int>(goldens()["cases"].size()));

  // Precompiled with Replace(" {2,}" -> " "), the older Metaspace alone.
  j = base_json();
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {precompiled, {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}}}}};
  j["pre_tokenizer"] = metaspace_old;
  EXPECT_EQ(expect_goldens("replace_space", j, all), static_cast<int>(goldens()["cases"].size()));

  // Precompiled alone and prepend_scheme "first": the same on plain prompts.
  j = base_json();
  j["normalizer"] = precompiled;
  j["pre_tokenizer"]["prepend_scheme"] = "first";
  EXPECT_GE(expect_goldens("precompiled_first", j, plain), 5);

  // No normalizer at all: the same on plain ASCII prompts (nmt_nfkc changes none of them).
  j = base_json();
  j["normalizer"] = nullptr;
  EXPECT_GE(expect_goldens("no_normalizer", j, [](const std::string& p) { return plain(p) && ascii(p); }), 3);

  // The extra ids only as added tokens after the vocabulary (not vocabulary entries): the same ids.
  j = base_json();
  j["model"]["vocab"].erase(j["model"]["vocab"].begin() + 600, j["model"]["vocab"].end());
  EXPECT_EQ(expect_goldens("extra_ids_added_only", j, all), static_cast<int>(goldens()["cases"].size()));

  // The extra ids only as vocabulary entries, not added tokens.
  j = base_json();
  j["added_tokens"].erase(j["added_tokens"].begin() + 3, j["added_tokens"].end());
  ASSERT_EQ(j["added_tokens"].back()["content"], "<unk>");
  EXPECT_EQ(expect_goldens("extra_ids_vocab_only", j, all), static_cast<int>(goldens()["cases"].size()));
}

TEST(T5TokenizerJson, ExtraIdsBeyondTheConfigAreText) {
  // tokenizer_config.json says 10 extra ids: <extra_id_50> typed in the prompt is text, as through
  // spiece.model, although the vocabulary has an <extra_id_50> entry (a CONTROL piece, never
  // matched in text), whether or not it is an added token.
  const Folder spiece("config10_spiece");
  fs::copy_file(kData + "/t5_tokenizer/spiece.model", fs::path(spiece.path()) / "spiece.model");
  spiece.write("tokenizer_config.json", R"({"extra_ids": 10})");
  const std::string prompt = "fill <extra_id_50> in";
  const std::vector<int32_t> expected = T5Tokenizer::load(spiece.path()).encode(prompt);
  EXPECT_GT(expected.size(), 10u);
  EXPECT_LT(*std::max_element(expected.begin(), expected.end()), 600);
  json j = base_json();
  for (int added = 0; added < 2; ++added) {
    const Folder folder("config10_json");
    folder.write_json(j);
    folder.write("tokenizer_config.json", R"({"extra_ids": 10})");
    const T5Tokenizer t = T5Tokenizer::load(folder.path());
    EXPECT_EQ(t.encode(prompt), expected) << (added == 0 ? "extra ids as added tokens" : "extra ids only in the vocabulary");
    j["added_tokens"].erase(j["added_tokens"].begin() + 3, j["added_tokens"].end());
  }
}

TEST(T5TokenizerJson, AddedTokensAfterTheVocabulary) {
  // A non-special added token is USER_DEFINED (matched in the text), a special one CONTROL (never:
  // cubevec splits out only T5's own special tokens).
  json j = base_json();
  j["added_tokens"].push_back({{"id", 701}, {"content", "<sep>"}, {"special", false}});
  j["added_tokens"].push_back({{"id", 700}, {"content", "<mask>"}, {"special", true}});
  const Folder folder("added");
  folder.write_json(j);
  const T5Tokenizer t = T5Tokenizer::load(folder.path());
  EXPECT_EQ(t.vocab_size(), 702);
  const std::vector<int32_t> sep = t.encode("cat<sep>dog"), mask = t.encode("cat<mask>dog");
  EXPECT_EQ(std::count(sep.begin(), sep.end(), 701), 1);
  EXPECT_EQ(std::count(mask.begin(), mask.end(), 700), 0);
  EXPECT_EQ(mask, t5_json().encode("cat<mask>dog"));
}

TEST(T5TokenizerJson, NoPrefixSpaceChangesTheIds) {
  // The Metaspace setting is read: without the dummy prefix the first word has no "▁".
  for (const json& pre : {json{{"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", "never"}, {"split", true}},
                          json{{"type", "Metaspace"}, {"replacement", kSpace}, {"add_prefix_space", false}}}) {
    json j = base_json();
    j["pre_tokenizer"] = pre;
    const Folder folder("never");
    folder.write_json(j);
    const T5Tokenizer t = T5Tokenizer::load(folder.path());
    const std::vector<int32_t> with_prefix = t5_json().encode("photo"), without = t.encode("photo");
    EXPECT_NE(without, with_prefix);
    EXPECT_EQ(t.encode("a photo"), [&] {  // the words after the first still take their "▁"
      std::vector<int32_t> ids = t.encode("a");
      ids.insert(ids.end(), with_prefix.begin(), with_prefix.end());
      return ids;
    }());
  }
}

TEST(T5TokenizerJson, SpieceModelFirstThenTokenizerJsonThenAnError) {
  const Folder folder("both");
  EXPECT_HAS(folder.load_error(), "not a T5 tokenizer folder (expected spiece.model or tokenizer.json)");
  folder.write("tokenizer.json", "{ not json");
  EXPECT_HAS(folder.load_error(), "tokenizer.json: not valid JSON");
  fs::copy_file(kData + "/t5_tokenizer/spiece.model", fs::path(folder.path()) / "spiece.model");
  EXPECT_EQ(T5Tokenizer::load(folder.path()).encode("a photo of a cat"), t5_json().encode("a photo of a cat"));
}

TEST(T5TokenizerJson, ModelErrors) {
  EXPECT_HAS(error_with("bpe", [](json& j) { j["model"]["type"] = "BPE"; }), "tokenizer.json: the model is BPE, not Unigram");
  EXPECT_HAS(error_with("no_model", [](json& j) { j.erase("model"); }), "tokenizer.json: has no 'model'");
  EXPECT_HAS(error_with("not_object", [](json& j) { j = json::array({1, 2}); }), "tokenizer.json: expected a JSON object");
  EXPECT_HAS(error_with("entry_string_score", [](json& j) { j["model"]["vocab"][5][1] = "-3.5"; }),
             "tokenizer.json: vocabulary entry 5 is not [piece, finite score]: [");
  EXPECT_HAS(error_with("entry_number_piece", [](json& j) { j["model"]["vocab"][7][0] = 7; }),
             "vocabulary entry 7 is not [piece, finite score]");
  EXPECT_HAS(error_with("entry_short", [](json& j) { j["model"]["vocab"][8] = json::array({"x"}); }),
             "vocabulary entry 8 is not [piece, finite score]");
  EXPECT_HAS(error_with("entry_huge", [](json& j) { j["model"]["vocab"][9][1] = -1e300; }),
             "vocabulary entry 9 is not [piece, finite score]");
  EXPECT_HAS(error_with("entry_empty", [](json& j) { j["model"]["vocab"][9][0] = ""; }), "vocabulary entry 9 is an empty piece");
  EXPECT_HAS(error_with("unk_700", [](json& j) { j["model"]["unk_id"] = 700; }),
             "tokenizer.json: the Unigram model's unk_id 700 is not an id of its 700-piece vocabulary");
  EXPECT_HAS(error_with("unk_null", [](json& j) { j["model"]["unk_id"] = nullptr; }), "unk_id null is not an id");
  EXPECT_HAS(error_with("unk_eos", [](json& j) { j["model"]["unk_id"] = 1; }), "unk_id 1 is the piece '</s>', not '<unk>'");
  EXPECT_HAS(error_with("duplicate", [](json& j) { j["model"]["vocab"][11][0] = j["model"]["vocab"][10][0]; }),
             "appears twice in the vocabulary (ids 10 and 11)");
  EXPECT_HAS(error_with("byte_fallback", [](json& j) { j["model"]["byte_fallback"] = true; }),
             "byte_fallback is true but the vocabulary has 0 of the 256 byte pieces");
}

TEST(T5TokenizerJson, MissingSpecialPieces) {
  const auto rename = [](const std::string& piece, const std::string& to) {
    return [=](json& j) {
      for (json& entry : j["model"]["vocab"])
        if (entry[0] == piece) entry[0] = to;
      for (json& token : j["added_tokens"])
        if (token["content"] == piece) token["content"] = to;
    };
  };
  EXPECT_HAS(error_with("no_eos", rename("</s>", "<eos>")),
             "tokenizer.json: has no '</s>' piece (a T5 vocabulary has </s>, <pad> and <unk>)");
  EXPECT_HAS(error_with("no_pad", rename("<pad>", "<padding>")), "has no '<pad>' piece");
  EXPECT_HAS(error_with("no_unk", rename("<unk>", "<unknown>")), "has no '<unk>' piece");
  EXPECT_HAS(error_with("added_mismatch", [](json& j) { j["added_tokens"][1]["id"] = 5; }),
             "the added token '</s>' has id 5 but is vocabulary piece 1");
  EXPECT_HAS(error_with("added_gap",
                        [](json& j) {
                          j["added_tokens"].push_back({{"id", 750}, {"content", "<new>"}, {"special", true}});
                        }),
             "the added token '<new>' has id 750, neither a vocabulary piece nor the next id (700)");
}

TEST(T5TokenizerJson, NormalizerAndPreTokenizerErrors) {
  EXPECT_HAS(error_with("base64_length", [](json& j) { j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = "abc"; }),
             "tokenizer.json: the Precompiled normalizer's 'precompiled_charsmap' is not base64 (its length 3 is not a multiple of 4)");
  EXPECT_HAS(error_with("base64_char", [](json& j) { j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = "ab!d"; }),
             "is not base64 (the byte 0x21 at offset 2 is not a base64 character)");
  EXPECT_HAS(error_with("charsmap_null", [](json& j) { j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = nullptr; }),
             "'precompiled_charsmap' must be a base64 string");
  EXPECT_HAS(error_with("charsmap_short", [](json& j) { j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = "AAAA"; }),
             "'precompiled_charsmap' is not a SentencePiece charsmap (it is 3 bytes, too short for a charsmap)");
  EXPECT_HAS(error_with("charsmap_no_trie", [](json& j) { j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = "AAAAAAAA"; }),
             "is not a SentencePiece charsmap (its trie size 0 does not fit its 6 bytes)");
  // 256 trie units: the root's children at 1000 ^ byte, outside the trie.
  std::string trie = charsmap_blob(1000u << 10);
  EXPECT_HAS(error_with("charsmap_outside", [&](json& j) { j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = base64(trie); }),
             "is not a SentencePiece charsmap (its trie unit 0 points outside the trie)");
  // The root has a leaf (bit 8); its value is read from unit 0 ^ offset 0, the root itself: 256,
  // beyond the 2 bytes of strings.
  trie = charsmap_blob(1u << 8);
  EXPECT_HAS(error_with("charsmap_rule", [&](json& j) { j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = base64(trie); }),
             "its trie unit 0 has a rule outside the normalized strings");
  trie.back() = 'x';
  EXPECT_HAS(error_with("charsmap_nul", [&](json& j) { j["normalizer"]["normalizers"][0]["precompiled_charsmap"] = base64(trie); }),
             "its normalized strings do not end with NUL");
  EXPECT_HAS(error_with("nfkc",
                        [](json& j) {
                          j["normalizer"] = {{"type", "NFKC"}};
                        }),
             "tokenizer.json: the normalizer type 'NFKC' is not one of a T5 tokenizer.json");
  EXPECT_HAS(error_with("nested_lowercase",
                        [](json& j) {
                          j["normalizer"]["normalizers"].push_back({{"type", "Lowercase"}});
                        }),
             "the normalizer type 'Lowercase'");
  EXPECT_HAS(error_with("replace_other",
                        [](json& j) {
                          j["normalizer"]["normalizers"][2]["pattern"] = {{"String", "a"}};
                        }),
             "the Replace normalizer {");
  EXPECT_HAS(error_with("normalizer_untyped", [](json& j) { j["normalizer"] = 3; }),
             "expected a normalizer to be an object with a string 'type', got 3");
  EXPECT_HAS(error_with("bytelevel",
                        [](json& j) {
                          j["pre_tokenizer"] = {{"type", "ByteLevel"}};
                        }),
             "tokenizer.json: the pre_tokenizer type 'ByteLevel' is not one of a T5 tokenizer.json");
  EXPECT_HAS(error_with("pre_null", [](json& j) { j["pre_tokenizer"] = nullptr; }), "'pre_tokenizer' is null");
  EXPECT_HAS(error_with("pre_missing", [](json& j) { j.erase("pre_tokenizer"); }), "has no 'pre_tokenizer'");
  EXPECT_HAS(error_with("whitespace_only",
                        [](json& j) {
                          j["pre_tokenizer"] = {{"type", "WhitespaceSplit"}};
                        }),
             "the pre_tokenizer has no Metaspace");
  EXPECT_HAS(error_with("replacement", [](json& j) { j["pre_tokenizer"]["replacement"] = "_"; }),
             "the Metaspace pre-tokenizer's replacement is \"_\"");
  EXPECT_HAS(error_with("scheme", [](json& j) { j["pre_tokenizer"]["prepend_scheme"] = "sometimes"; }),
             "prepend_scheme is \"sometimes\" (expected \"always\", \"first\" or \"never\")");
  EXPECT_HAS(error_with("prefix_space",
                        [](json& j) {
                          j["pre_tokenizer"].erase("prepend_scheme");
                          j["pre_tokenizer"]["add_prefix_space"] = "yes";
                        }),
             "the Metaspace pre-tokenizer: 'add_prefix_space' must be true or false, got \"yes\"");
}

TEST(T5TokenizerJson, Base64) {
  using cubevec::tokenizers::decode_base64;
  EXPECT_EQ(decode_base64(""), "");
  EXPECT_EQ(decode_base64("Zg=="), "f");
  EXPECT_EQ(decode_base64("Zm8="), "fo");
  EXPECT_EQ(decode_base64("Zm9v"), "foo");
  EXPECT_EQ(decode_base64("+/+/AAEC"), std::string("\xfb\xff\xbf\x00\x01\x02", 6));
  const std::string bytes = charsmap_blob(12345);
  for (std::size_t n = 0; n <= 6; ++n) EXPECT_EQ(decode_base64(base64(bytes.substr(n))), bytes.substr(n));
  EXPECT_HAS(error_of([] { decode_base64("Zm9="); }), "the padding bits at its end are not zero");
  EXPECT_HAS(error_of([] { decode_base64("Zh=="); }), "the padding bits at its end are not zero");
  EXPECT_HAS(error_of([] { decode_base64("Z==="); }), "the byte 0x3D at offset 1 is not a base64 character");
  EXPECT_HAS(error_of([] { decode_base64("Zm9v\n"); }), "its length 5 is not a multiple of 4");
  EXPECT_HAS(error_of([] { decode_base64("Zm 9"); }), "the byte 0x20 at offset 2");
}

}  // namespace t5_tokenizer_json_test
