#include "tokenizers/clip_tokenizer.h"

#include <array>
#include <filesystem>
#include <limits>

#include "base/error.h"
#include "base/regular_file.h"
#include "base/strict_json.h"
#include "tokenizers/unicode_text.h"

namespace cubevec::tokenizers {

namespace {

const std::string kStart = "<|startoftext|>", kEnd = "<|endoftext|>";
constexpr std::u32string_view kStart32 = U"<|startoftext|>", kEnd32 = U"<|endoftext|>";

// GPT-2's bytes_to_unicode: printable bytes keep their code point, the other 68 take 256, 257, ...
// in byte order (so ' ' is U+0120), each as the UTF-8 of that code point.
const std::array<std::string, 256>& byte_symbols() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[static_cast<std::size_t>(b)] = encode_utf8(std::u32string(1, printable ? static_cast<char32_t>(b) : next++));
    }
    return t;
  }();
  return table;
}

// A special token's text from special_tokens_map.json / tokenizer_config.json: a string or {"content": ...}.
std::string token_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) return value["content"].get<std::string>();
  return {};
}

// BERT's BasicTokenizer without accent stripping or punctuation splitting, as CLIPTokenizer uses
// it when ftfy is absent: the words of `text`, cleaned, NFC, lower-cased, joined by single spaces.
std::u32string basic_clean(const std::u32string& text) {
  std::u32string cleaned;
  for (char32_t c : text) {
    const bool kept_whitespace = c == U'\t' || c == U'\n' || c == U'\r';
    if (c == 0 || c == 0xFFFD || (is_other(c) && !kept_whitespace)) continue;
    if (c == U' ' || kept_whitespace || is_space_separator(c)) {
      cleaned.push_back(U' ');
    } else if (is_cjk_ideograph(c)) {
      cleaned += U' ';
      cleaned.push_back(c);
      cleaned += U' ';
    } else {
      cleaned.push_back(c);
    }
  }
  const std::u32string normalized = nfc(cleaned);
  std::u32string joined, word;
  const auto flush = [&] {
    if (word.empty()) return;
    if (!joined.empty()) joined.push_back(U' ');
    joined += to_lower(word);
    word.clear();
  };
  for (char32_t c : normalized) {
    if (is_python_space(c)) flush();
    else word.push_back(c);
  }
  flush();
  return joined;
}

bool starts_with(const std::u32string& text, std::size_t at, std::u32string_view prefix) {
  return text.compare(at, prefix.size(), prefix) == 0;
}

// CLIP's pre-split: <|startoftext|>|<|endoftext|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+
// on text whose only whitespace is ' ' (basic_clean made it so).
std::vector<std::string> pre_split(const std::u32string& text) {
  static const std::u32string_view specials[] = {kStart32, kEnd32};
  static const std::u32string_view contractions[] = {U"'s", U"'t", U"'re", U"'ve", U"'m", U"'ll", U"'d"};
  std::vector<std::string> pieces;
  std::size_t i = 0;
  while (i < text.size()) {
    const char32_t c = text[i];
    if (c == U' ') {
      ++i;
      continue;
    }
    std::size_t end = i;
    for (const auto& s : specials)
      if (end == i && starts_with(text, i, s)) end = i + s.size();
    for (const auto& s : contractions)
      if (end == i && starts_with(text, i, s)) end = i + s.size();
    if (end == i) {
      if (is_letter(c)) {
        while (end < text.size() && is_letter(text[end])) ++end;
      } else if (is_number(c)) {
        end = i + 1;
      } else {
        while (end < text.size() && text[end] != U' ' && !is_letter(text[end]) && !is_number(text[end])) ++end;
      }
    }
    pieces.push_back(encode_utf8(std::u32string_view(text).substr(i, end - i)));
    i = end;
  }
  return pieces;
}

}  // namespace

ClipTokenizer ClipTokenizer::load(const std::string& dir) {
  ClipTokenizer t;
  t.source_ = dir;
  const std::string vocab_path = dir + "/vocab.json", merges_path = dir + "/merges.txt";
  for (const std::string& path : {vocab_path, merges_path})
    if (!std::filesystem::exists(path))
      throw Error(dir + ": not a CLIP tokenizer folder (expected vocab.json and merges.txt; " + path + " is missing)");
  const nlohmann::json vocab = read_json_file(vocab_path, 2);
  if (!vocab.is_object() || vocab.empty()) throw Error(vocab_path + ": expected a JSON object mapping tokens to ids");
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
      throw Error(vocab_path + ": the id of '" + token + "' must be a non-negative integer, got " + id.dump());
    t.vocab_[token] = static_cast<int32_t>(id.get<uint64_t>());
  }
  for (const std::string& special : {kStart, kEnd})
    if (!t.vocab_.count(special)) throw Error(vocab_path + ": has no '" + special + "' (a CLIP vocabulary has both special tokens)");
  t.bos_id_ = t.vocab_.at(kStart);
  t.eos_id_ = t.vocab_.at(kEnd);

  // transformers reads one header line, then at most 48,894 merges (49,408 - 256 - 256 - 2).
  const std::string merges = read_regular_file(merges_path, std::size_t{64} << 20);
  std::size_t line_start = 0, line_number = 0;
  while (line_start < merges.size()) {
    std::size_t line_end = merges.find('\n', line_start);
    if (line_end == std::string::npos) line_end = merges.size();
    const std::string line = merges.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    if (line_number++ == 0 || line.empty()) continue;  // the "#version" header
    if (t.merge_ranks_.size() == 48894) break;
    const std::size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() || line.find(' ', space + 1) != std::string::npos)
      throw Error(merges_path + ": line " + std::to_string(line_number) + " must be two symbols separated by one space, got '" + line +
                  "'");
    const std::string joined = line.substr(0, space) + line.substr(space + 1);
    if (!t.vocab_.count(joined))
      throw Error(merges_path + ": line " + std::to_string(line_number) + " merges into '" + joined + "', which vocab.json does not have");
    t.merge_ranks_.emplace(line, static_cast<int32_t>(t.merge_ranks_.size()));
  }

  // The pad token: special_tokens_map.json, else tokenizer_config.json, else <|endoftext|> (CLIPTokenizer's default).
  std::string pad = kEnd;
  for (const std::string name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const std::string path = dir + "/" + name;
    if (!std::filesystem::exists(path)) continue;
    const nlohmann::json config = read_json_file(path);
    if (!config.is_object()) throw Error(path + ": expected a JSON object");
    if (config.contains("pad_token") && !token_text(config["pad_token"]).empty()) pad = token_text(config["pad_token"]);
    if (name == "tokenizer_config.json" && config.contains("model_max_length")) {
      const nlohmann::json& m = config["model_max_length"];
      // Some folders write a huge sentinel (1e30) meaning "no limit": CLIP's positions are 77.
      if (!m.is_number() || m.get<double>() < 2) throw Error(path + ": 'model_max_length' must be a number >= 2, got " + m.dump());
      t.model_max_length_ = m.get<double>() > 1e6 ? 77 : static_cast<int>(m.get<double>());
    }
  }
  if (!t.vocab_.count(pad)) throw Error(dir + ": the pad token '" + pad + "' is not in vocab.json");
  t.pad_id_ = t.vocab_.at(pad);
  return t;
}

std::vector<int32_t> ClipTokenizer::bpe(const std::string& pre_token) const {
  if (pre_token == kStart || pre_token == kEnd) return {vocab_.at(pre_token)};
  const auto& symbols = byte_symbols();
  std::vector<std::string> word;
  for (unsigned char b : pre_token) word.push_back(symbols[b]);
  word.back() += "</w>";
  while (word.size() > 1) {
    int32_t best = std::numeric_limits<int32_t>::max();
    std::size_t best_at = 0;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = merge_ranks_.find(word[i] + " " + word[i + 1]);
      if (it != merge_ranks_.end() && it->second < best) best = it->second, best_at = i;
    }
    if (best == std::numeric_limits<int32_t>::max()) break;
    const std::string first = word[best_at], second = word[best_at + 1];
    std::vector<std::string> merged;
    for (std::size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(word[i++]);
      }
    }
    word = std::move(merged);
  }
  std::vector<int32_t> ids;
  for (const std::string& symbol : word) {
    const auto it = vocab_.find(symbol);
    ids.push_back(it == vocab_.end() ? eos_id_ : it->second);  // CLIP's unk is <|endoftext|>; a complete vocab never needs it
  }
  return ids;
}

std::vector<int32_t> ClipTokenizer::encode(const std::string& prompt, const std::string& what) const {
  const std::u32string text = decode_utf8(prompt, what);
  std::vector<int32_t> ids;
  // Special tokens typed as such are split out first (transformers' added-token split), exact case.
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t next = std::u32string::npos, length = 0;
    int32_t special = 0;
    for (const auto& [s, id] : {std::pair{kStart32, bos_id_}, std::pair{kEnd32, eos_id_}}) {
      const std::size_t at = text.find(s, start);
      if (at < next) next = at, length = s.size(), special = id;
    }
    const std::size_t end = next == std::u32string::npos ? text.size() : next;
    for (const std::string& piece : pre_split(basic_clean(text.substr(start, end - start))))
      for (int32_t id : bpe(piece)) ids.push_back(id);
    if (next == std::u32string::npos) break;
    ids.push_back(special);
    start = next + length;
  }
  return ids;
}

std::vector<int32_t> ClipTokenizer::encode_padded(const std::string& prompt, int max_length, const std::string& what) const {
  if (max_length == 0) max_length = model_max_length_;
  if (max_length < 2)
    throw Error(what + ": the maximum length must be at least 2 (<|startoftext|> and <|endoftext|>), got " + std::to_string(max_length));
  std::vector<int32_t> content = encode(prompt, what);
  if (content.size() > static_cast<std::size_t>(max_length - 2)) content.resize(static_cast<std::size_t>(max_length - 2));
  std::vector<int32_t> ids{bos_id_};
  ids.insert(ids.end(), content.begin(), content.end());
  ids.push_back(eos_id_);
  ids.resize(static_cast<std::size_t>(max_length), pad_id_);
  return ids;
}

}  // namespace cubevec::tokenizers
