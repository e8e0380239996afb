#include "tokenizers/t5_tokenizer_json.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "base/strict_json.h"
#include "tokenizers/sentencepiece_proto.h"

namespace cubevec::tokenizers {

namespace {

using nlohmann::json;
using Type = SentencePieceEntry::Type;

const std::string kSpace = "\xe2\x96\x81";  // "▁", U+2581, SentencePiece's space

// A JSON value as an error message shows it: at most 80 characters.
std::string brief(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// A piece or token as a message shows it, quoted and cut at 80 bytes.
std::string quote_piece(const std::string& text) { return "'" + (text.size() > 80 ? text.substr(0, 77) + "..." : text) + "'"; }

// libsentencepiece walks the charsmap's double-array trie (darts-clone) without bounds checks and
// reads each rule's output as a NUL-terminated string, so a crafted charsmap could make it read
// outside the blob. The blob is [uint32 trie bytes][trie units][outputs]; a unit's children sit at
// (index ^ offset) ^ byte, a leaf's value is an offset into the outputs. Every walk stays inside
// when each non-leaf unit's children block is inside the trie and each leaf value points into the
// outputs, which end with NUL. Throws saying what is wrong.
void check_precompiled_charsmap(const std::string& blob) {
  const auto u32 = [&](std::size_t at) {
    uint32_t v = 0;
    for (int b = 3; b >= 0; --b) v = v << 8 | static_cast<unsigned char>(blob[at + static_cast<std::size_t>(b)]);
    return v;
  };
  if (blob.size() < 4) throw Error("it is " + std::to_string(blob.size()) + " bytes, too short for a charsmap");
  const std::size_t trie_bytes = u32(0);
  if (trie_bytes < 4 || trie_bytes % 4 != 0 || trie_bytes > blob.size() - 4)
    throw Error("its trie size " + std::to_string(trie_bytes) + " does not fit its " + std::to_string(blob.size()) + " bytes");
  const std::size_t units = trie_bytes / 4, outputs = blob.size() - 4 - trie_bytes;
  if (outputs > 0 && blob.back() != '\0') throw Error("its normalized strings do not end with NUL");
  for (std::size_t i = 0; i < units; ++i) {
    const uint32_t unit = u32(4 + 4 * i);
    if (unit >> 31) continue;  // a leaf unit: its label never matches a byte, it is only read for its value
    const std::size_t base = i ^ ((unit >> 10) << ((unit & (1U << 9)) >> 6));
    if ((base | 0xFF) >= units) throw Error("its trie unit " + std::to_string(i) + " points outside the trie");
    if ((unit >> 8 & 1) && (u32(4 + 4 * base) & 0x7FFFFFFFu) >= outputs)
      throw Error("its trie unit " + std::to_string(i) + " has a rule outside the normalized strings");
  }
}

// What the normalizer and pre-tokenizer say about characters and spaces.
struct TextRules {
  bool has_charsmap = false;
  std::string charsmap;
  bool collapse_spaces = false;  // Replace(" {2,}") or WhitespaceSplit
  bool has_metaspace = false;
  bool add_dummy_prefix = true;
};

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& message) const { throw Error(path_ + ": " + message); }

  std::string type_of(const json& value, const char* what) const {
    if (!value.is_object() || !value.contains("type") || !value["type"].is_string())
      fail(std::string("expected ") + what + " to be an object with a string 'type', got " + brief(value));
    return value["type"].get<std::string>();
  }

  bool optional_bool(const json& object, const char* key, bool fallback, const std::string& what) const {
    if (!object.contains(key)) return fallback;
    if (!object[key].is_boolean()) fail(what + ": '" + key + "' must be true or false, got " + brief(object[key]));
    return object[key].get<bool>();
  }

  void read_normalizer(const json& n, TextRules& rules) const {
    if (n.is_null()) return;
    const std::string type = type_of(n, "a normalizer");
    if (type == "Sequence") {
      if (!n.contains("normalizers") || !n["normalizers"].is_array()) fail("the Sequence normalizer has no 'normalizers' array");
      for (const json& item : n["normalizers"]) read_normalizer(item, rules);
    } else if (type == "Precompiled") {
      if (rules.has_charsmap) fail("has two Precompiled normalizers (expected one)");
      if (!n.contains("precompiled_charsmap") || !n["precompiled_charsmap"].is_string())
        fail("the Precompiled normalizer's 'precompiled_charsmap' must be a base64 string");
      try {
        rules.charsmap = decode_base64(n["precompiled_charsmap"].get_ref<const std::string&>());
      } catch (const Error& e) {
        fail(std::string("the Precompiled normalizer's 'precompiled_charsmap' is not base64 (") + e.what() + ")");
      }
      try {
        check_precompiled_charsmap(rules.charsmap);
      } catch (const Error& e) {
        fail(std::string("the Precompiled normalizer's 'precompiled_charsmap' is not a SentencePiece charsmap (") + e.what() + ")");
      }
      rules.has_charsmap = true;
    } else if (type == "Strip") {
      // SpmConverter's Strip(left=false, right=true); SentencePiece strips with the whitespace rules.
      optional_bool(n, "strip_left", false, "the Strip normalizer");
      optional_bool(n, "strip_right", true, "the Strip normalizer");
    } else if (type == "Replace") {
      const json* pattern = n.contains("pattern") ? &n["pattern"] : nullptr;
      const bool spaces =
          pattern && pattern->is_object() && pattern->size() == 1 && pattern->contains("Regex") && (*pattern)["Regex"] == " {2,}";
      const bool content = n.contains("content") && (n["content"] == kSpace || n["content"] == " ");
      if (!spaces || !content)
        fail("the Replace normalizer " + brief(n) + " is not T5's (pattern {\"Regex\": \" {2,}\"}, content \"" + kSpace + "\" or \" \")");
      rules.collapse_spaces = true;
    } else {
      fail("the normalizer type '" + type + "' is not one of a T5 tokenizer.json (Precompiled, Strip, Replace, Sequence, or null)");
    }
  }

  void read_pre_tokenizer(const json& p, TextRules& rules) const {
    if (p.is_null()) fail("'pre_tokenizer' is null; a T5 tokenizer.json has a Metaspace pre-tokenizer");
    const std::string type = type_of(p, "a pre_tokenizer");
    if (type == "Sequence") {
      if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array()) fail("the Sequence pre_tokenizer has no 'pretokenizers' array");
      for (const json& item : p["pretokenizers"]) read_pre_tokenizer(item, rules);
    } else if (type == "WhitespaceSplit") {
      rules.collapse_spaces = true;
    } else if (type == "Metaspace") {
      if (rules.has_metaspace) fail("has two Metaspace pre-tokenizers (expected one)");
      rules.has_metaspace = true;
      if (p.contains("replacement") && p["replacement"] != kSpace)
        fail("the Metaspace pre-tokenizer's replacement is " + brief(p["replacement"]) + ", not \"" + kSpace + "\" (SentencePiece's)");
      if (p.contains("prepend_scheme")) {
        const json& scheme = p["prepend_scheme"];
        if (scheme == "always" || scheme == "first") rules.add_dummy_prefix = true;
        else if (scheme == "never") rules.add_dummy_prefix = false;
        else fail("the Metaspace pre-tokenizer's prepend_scheme is " + brief(scheme) + " (expected \"always\", \"first\" or \"never\")");
      } else {
        rules.add_dummy_prefix = optional_bool(p, "add_prefix_space", true, "the Metaspace pre-tokenizer");
      }
      optional_bool(p, "split", true, "the Metaspace pre-tokenizer");
    } else {
      fail("the pre_tokenizer type '" + type + "' is not one of a T5 tokenizer.json (Metaspace, WhitespaceSplit, Sequence)");
    }
  }

 private:
  std::string path_;
};

bool is_extra_id_piece(const std::string& piece) {
  if (piece.size() < 12 || piece.rfind("<extra_id_", 0) != 0 || piece.back() != '>') return false;
  const std::string digits = piece.substr(10, piece.size() - 11);
  return digits.find_first_not_of("0123456789") == std::string::npos;
}

// SentencePiece's byte pieces: "<0x00>" ... "<0xFF>", upper-case hex.
bool is_byte_piece(const std::string& piece) {
  constexpr std::string_view kHex = "0123456789ABCDEF";
  return piece.size() == 6 && piece.rfind("<0x", 0) == 0 && piece[5] == '>' && kHex.find(piece[3]) != std::string_view::npos &&
         kHex.find(piece[4]) != std::string_view::npos;
}

}  // namespace

std::string decode_base64(std::string_view text) {
  static const std::array<int8_t, 256> values = [] {
    std::array<int8_t, 256> v{};
    v.fill(-1);
    const std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (std::size_t i = 0; i < alphabet.size(); ++i) v[static_cast<unsigned char>(alphabet[i])] = static_cast<int8_t>(i);
    return v;
  }();
  if (text.size() % 4 != 0) throw Error("its length " + std::to_string(text.size()) + " is not a multiple of 4");
  std::size_t padding = 0;
  if (!text.empty() && text.back() == '=') padding = text[text.size() - 2] == '=' ? 2 : 1;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t bits = 0;
  for (std::size_t i = 0; i < text.size() - padding; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const int8_t v = values[c];
    if (v < 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(c));
      throw Error("the byte " + std::string(hex) + " at offset " + std::to_string(i) + " is not a base64 character");
    }
    bits = bits << 6 | static_cast<uint32_t>(v);
    if (i % 4 == 3) {
      out.push_back(static_cast<char>(bits >> 16 & 0xFF));
      out.push_back(static_cast<char>(bits >> 8 & 0xFF));
      out.push_back(static_cast<char>(bits & 0xFF));
      bits = 0;
    }
  }
  // The last group: 2 characters (12 bits) give 1 byte, 3 (18 bits) give 2; the rest must be zero.
  if (padding == 2) {
    if (bits & 0x0F) throw Error("the padding bits at its end are not zero");
    out.push_back(static_cast<char>(bits >> 4 & 0xFF));
  } else if (padding == 1) {
    if (bits & 0x03) throw Error("the padding bits at its end are not zero");
    out.push_back(static_cast<char>(bits >> 10 & 0xFF));
    out.push_back(static_cast<char>(bits >> 2 & 0xFF));
  }
  return out;
}

std::string sentencepiece_model_from_tokenizer_json(const std::string& path) {
  const Reader r(path);
  const json root = read_json_file(path);  // strict, a regular file of at most 64 MiB
  if (!root.is_object()) r.fail("expected a JSON object (a Hugging Face tokenizer.json)");

  // The model: a Unigram vocabulary of [piece, score] with unk_id.
  if (!root.contains("model")) r.fail("has no 'model'");
  const json& model = root["model"];
  const std::string model_type = r.type_of(model, "'model'");
  if (model_type != "Unigram")
    r.fail("the model is " + model_type + ", not Unigram (a T5 / umT5 tokenizer.json holds a SentencePiece Unigram model)");
  if (!model.contains("vocab") || !model["vocab"].is_array() || model["vocab"].empty())
    r.fail("the Unigram model has no 'vocab' list of [piece, score]");
  const json& vocab = model["vocab"];
  if (vocab.size() > static_cast<std::size_t>(std::numeric_limits<int32_t>::max()))
    r.fail("the vocabulary has more pieces than an int32 id holds");
  UnigramModelSpec spec;
  spec.normalizer_name = "tokenizer.json";
  spec.pieces.reserve(vocab.size());
  std::unordered_map<std::string, int32_t> ids;
  ids.reserve(vocab.size());
  for (std::size_t i = 0; i < vocab.size(); ++i) {
    const json& entry = vocab[i];
    const bool shaped = entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_number();
    const double value = shaped ? entry[1].get<double>() : 0.0;
    // A score is a float in the model: beyond float's range (or inf from an overflowing literal) is refused.
    if (!shaped || !std::isfinite(value) || std::fabs(value) > std::numeric_limits<float>::max())
      r.fail("vocabulary entry " + std::to_string(i) + " is not [piece, finite score]: " + brief(entry));
    const std::string& piece = entry[0].get_ref<const std::string&>();
    if (piece.empty()) r.fail("vocabulary entry " + std::to_string(i) + " is an empty piece");
    const auto [it, added] = ids.emplace(piece, static_cast<int32_t>(i));
    if (!added)
      r.fail("the piece " + quote_piece(piece) + " appears twice in the vocabulary (ids " + std::to_string(it->second) + " and " +
             std::to_string(i) + ")");
    spec.pieces.push_back({piece, static_cast<float>(value), Type::Normal});
  }
  if (!model.contains("unk_id") || !model["unk_id"].is_number_unsigned() || model["unk_id"].get<uint64_t>() >= vocab.size())
    r.fail("the Unigram model's unk_id " + (model.contains("unk_id") ? brief(model["unk_id"]) : std::string("(missing)")) +
           " is not an id of its " + std::to_string(vocab.size()) + "-piece vocabulary");
  spec.unk_id = static_cast<int32_t>(model["unk_id"].get<uint64_t>());
  spec.byte_fallback = r.optional_bool(model, "byte_fallback", false, "the Unigram model");

  // Added tokens: special ones are CONTROL, the others USER_DEFINED; one outside the vocabulary
  // must take the next id.
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    const json& added = root["added_tokens"];
    if (!added.is_array()) r.fail("'added_tokens' must be a list, got " + brief(added));
    std::vector<const json*> tokens;
    for (const json& token : added) {
      if (!token.is_object() || !token.contains("id") || !token["id"].is_number_unsigned() || !token.contains("content") ||
          !token["content"].is_string() || token["content"].get_ref<const std::string&>().empty())
        r.fail("an added token is not an object with an integer 'id' and a non-empty 'content': " + brief(token));
      tokens.push_back(&token);
    }
    std::stable_sort(tokens.begin(), tokens.end(),
                     [](const json* a, const json* b) { return (*a)["id"].get<uint64_t>() < (*b)["id"].get<uint64_t>(); });
    for (const json* token : tokens) {
      const std::string& content = (*token)["content"].get_ref<const std::string&>();
      const uint64_t id = (*token)["id"].get<uint64_t>();
      const bool special = r.optional_bool(*token, "special", false, "the added token " + quote_piece(content));
      const auto found = ids.find(content);
      if (found != ids.end()) {
        if (static_cast<uint64_t>(found->second) != id)
          r.fail("the added token " + quote_piece(content) + " has id " + std::to_string(id) + " but is vocabulary piece " +
                 std::to_string(found->second));
      } else {
        if (id != spec.pieces.size())
          r.fail("the added token " + quote_piece(content) + " has id " + std::to_string(id) +
                 ", neither a vocabulary piece nor the next id (" + std::to_string(spec.pieces.size()) + ")");
        if (spec.pieces.size() >= static_cast<std::size_t>(std::numeric_limits<int32_t>::max())) r.fail("too many added tokens");
        ids.emplace(content, static_cast<int32_t>(id));
        spec.pieces.push_back({content, 0.0f, Type::Normal});
      }
      if (static_cast<int32_t>(id) != spec.unk_id) spec.pieces[id].type = special ? Type::Control : Type::UserDefined;
    }
  }

  // T5's own specials, whatever added_tokens says.
  const auto id_of = [&](const std::string& piece) {
    const auto found = ids.find(piece);
    if (found == ids.end()) r.fail("has no " + quote_piece(piece) + " piece (a T5 vocabulary has </s>, <pad> and <unk>)");
    return found->second;
  };
  spec.eos_id = id_of("</s>");
  spec.pad_id = id_of("<pad>");
  if (id_of("<unk>") != spec.unk_id)
    r.fail("the Unigram model's unk_id " + std::to_string(spec.unk_id) + " is the piece " +
           quote_piece(spec.pieces[static_cast<std::size_t>(spec.unk_id)].piece) + ", not '<unk>'");
  int byte_pieces = 0;
  for (std::size_t i = 0; i < spec.pieces.size(); ++i) {
    SentencePieceEntry& p = spec.pieces[i];
    if (static_cast<int32_t>(i) == spec.unk_id) p.type = Type::Unknown;
    else if (p.piece == "</s>" || p.piece == "<pad>" || is_extra_id_piece(p.piece)) p.type = Type::Control;
    else if (spec.byte_fallback && p.type == Type::Normal && is_byte_piece(p.piece)) p.type = Type::Byte, ++byte_pieces;
  }
  if (spec.byte_fallback && byte_pieces != 256)
    r.fail("byte_fallback is true but the vocabulary has " + std::to_string(byte_pieces) + " of the 256 byte pieces <0x00> ... <0xFF>");

  // The text rules.
  TextRules rules;
  r.read_normalizer(root.contains("normalizer") ? root["normalizer"] : json(nullptr), rules);
  if (!root.contains("pre_tokenizer")) r.fail("has no 'pre_tokenizer' (a T5 tokenizer.json has a Metaspace pre-tokenizer)");
  r.read_pre_tokenizer(root["pre_tokenizer"], rules);
  if (!rules.has_metaspace) r.fail("the pre_tokenizer has no Metaspace (T5's, that writes spaces as \"" + kSpace + "\")");
  spec.precompiled_charsmap = rules.charsmap;
  spec.add_dummy_prefix = rules.add_dummy_prefix;
  spec.remove_extra_whitespaces = rules.collapse_spaces;
  spec.escape_whitespaces = true;
  return serialize_unigram_model(spec);
}

}  // namespace cubevec::tokenizers
