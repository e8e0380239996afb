#include "tokenizers/t5_tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>
#include <system_error>

#include "base/error.h"
#include "base/regular_file.h"
#include "base/strict_json.h"
#include "tokenizers/t5_tokenizer_json.h"
#include "tokenizers/unicode_text.h"

namespace cubevec::tokenizers {

T5Tokenizer::T5Tokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
T5Tokenizer::~T5Tokenizer() = default;
T5Tokenizer::T5Tokenizer(T5Tokenizer&&) noexcept = default;
T5Tokenizer& T5Tokenizer::operator=(T5Tokenizer&&) noexcept = default;

T5Tokenizer T5Tokenizer::load(const std::string& dir) {
  T5Tokenizer t;
  t.source_ = dir;
  const auto present = [](const std::string& path) {
    std::error_code ec;
    return std::filesystem::exists(path, ec);
  };
  const std::string spiece = dir + "/spiece.model", tokenizer_json = dir + "/tokenizer.json";
  std::string model;  // the file the pieces come from, for messages
  if (present(spiece)) {
    model = spiece;
    // Read through cubevec's own checks (a regular file, bounded), then hand the bytes over.
    const std::string bytes = read_regular_file(spiece, std::size_t{256} << 20);
    const sentencepiece::util::Status status = t.sp_->LoadFromSerializedProto(bytes);
    if (!status.ok()) throw Error(spiece + ": not a SentencePiece model (" + status.ToString() + ")");
  } else if (present(tokenizer_json)) {
    model = tokenizer_json;
    const sentencepiece::util::Status status = t.sp_->LoadFromSerializedProto(sentencepiece_model_from_tokenizer_json(tokenizer_json));
    if (!status.ok()) throw Error(tokenizer_json + ": SentencePiece refused the model built from it (" + status.ToString() + ")");
    // The extra ids are vocabulary entries here (T5Converter appends <extra_id_99> ... <extra_id_0>):
    // as many as there are, unless tokenizer_config.json says otherwise.
    t.extra_ids_ = 0;
    while (t.extra_ids_ < 100000 && t.sp_->IdToPiece(t.sp_->PieceToId("<extra_id_" + std::to_string(t.extra_ids_) + ">")) ==
                                        "<extra_id_" + std::to_string(t.extra_ids_) + ">")
      ++t.extra_ids_;
  } else {
    throw Error(dir + ": not a T5 tokenizer folder (expected spiece.model or tokenizer.json)");
  }
  const std::string config_path = dir + "/tokenizer_config.json";
  if (present(config_path)) {
    const nlohmann::json config = read_json_file(config_path);
    if (!config.is_object()) throw Error(config_path + ": expected a JSON object");
    if (config.contains("extra_ids")) {
      const nlohmann::json& e = config["extra_ids"];
      if (!e.is_number_unsigned() || e.get<uint64_t>() > 100000)
        throw Error(config_path + ": 'extra_ids' must be an integer from 0 to 100000, got " + e.dump());
      t.extra_ids_ = static_cast<int>(e.get<uint64_t>());
    }
  }
  const auto id_of = [&](const char* piece) {
    const int id = t.sp_->PieceToId(piece);
    if (t.sp_->IdToPiece(id) != piece)
      throw Error(model + ": has no '" + std::string(piece) + "' piece (a T5 vocabulary has </s>, <pad> and <unk>)");
    return static_cast<int32_t>(id);
  };
  t.eos_id_ = id_of("</s>");
  t.pad_id_ = id_of("<pad>");
  t.unk_id_ = id_of("<unk>");
  return t;
}

int T5Tokenizer::vocab_size() const {
  int extra_not_pieces = 0;
  for (int n = 0; n < extra_ids_; ++n)
    if (sp_->IdToPiece(sp_->PieceToId("<extra_id_" + std::to_string(n) + ">")) != "<extra_id_" + std::to_string(n) + ">")
      ++extra_not_pieces;
  return sp_->GetPieceSize() + extra_not_pieces;
}

int32_t T5Tokenizer::extra_id(int n) const {
  const std::string name = "<extra_id_" + std::to_string(n) + ">";
  const int id = sp_->PieceToId(name);
  if (sp_->IdToPiece(id) == name) return static_cast<int32_t>(id);
  return static_cast<int32_t>(sp_->GetPieceSize() + extra_ids_ - 1 - n);
}

std::vector<int32_t> T5Tokenizer::encode(const std::string& prompt, const std::string& what) const {
  decode_utf8(prompt, what);  // not UTF-8: an error naming the byte, as for CLIP
  std::vector<int32_t> ids;
  const auto encode_piece = [&](std::string text) {
    std::vector<int> piece_ids;
    const sentencepiece::util::Status status = sp_->Encode(text, &piece_ids);
    if (!status.ok()) throw Error(what + ": SentencePiece could not encode it (" + status.ToString() + ")");
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
  };
  // The special tokens typed in the prompt, found left to right (the longest at a position).
  std::size_t start = 0, scan = 0;
  bool strip_left = false;
  while (scan < prompt.size()) {
    const std::size_t open = prompt.find('<', scan);
    if (open == std::string::npos) break;
    const std::size_t close = prompt.find('>', open);
    if (close == std::string::npos) break;
    const std::string candidate = prompt.substr(open, close - open + 1);
    int32_t special = -1;
    bool is_extra = false;
    if (candidate == "</s>") special = eos_id_;
    else if (candidate == "<pad>") special = pad_id_;
    else if (candidate == "<unk>") special = unk_id_;
    else if (candidate.rfind("<extra_id_", 0) == 0 && candidate.size() > 11 && candidate.size() <= 17) {
      const std::string digits = candidate.substr(10, candidate.size() - 11);
      if (digits.find_first_not_of("0123456789") == std::string::npos && (digits.size() == 1 || digits[0] != '0')) {
        const int n = std::stoi(digits);
        if (n < extra_ids_) special = extra_id(n), is_extra = true;
      }
    }
    if (special < 0) {
      scan = open + 1;
      continue;
    }
    std::string before = prompt.substr(start, open - start);
    // <extra_id_N> is added with lstrip and rstrip: the whitespace around it goes with it.
    if (is_extra) before.erase(before.find_last_not_of(" \t\n\r") + 1);
    if (strip_left)
      before.erase(0, before.find_first_not_of(" \t\n\r") == std::string::npos ? before.size() : before.find_first_not_of(" \t\n\r"));
    if (!before.empty()) encode_piece(before);
    ids.push_back(special);
    strip_left = is_extra;
    start = scan = close + 1;
  }
  std::string rest = prompt.substr(start);
  if (strip_left) rest.erase(0, rest.find_first_not_of(" \t\n\r") == std::string::npos ? rest.size() : rest.find_first_not_of(" \t\n\r"));
  if (!rest.empty()) encode_piece(rest);
  return ids;
}

PaddedIds T5Tokenizer::encode_padded(const std::string& prompt, int max_length, const std::string& what) const {
  if (max_length < 1) throw Error(what + ": the maximum length must be at least 1 (for </s>), got " + std::to_string(max_length));
  std::vector<int32_t> content = encode(prompt, what);
  if (content.size() > static_cast<std::size_t>(max_length - 1)) content.resize(static_cast<std::size_t>(max_length - 1));
  PaddedIds out;
  out.ids = content;
  out.ids.push_back(eos_id_);
  out.attention_mask.assign(out.ids.size(), 1);
  out.ids.resize(static_cast<std::size_t>(max_length), pad_id_);
  out.attention_mask.resize(static_cast<std::size_t>(max_length), 0);
  return out;
}

}  // namespace cubevec::tokenizers
