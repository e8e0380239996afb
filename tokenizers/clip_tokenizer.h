// CLIP's tokenizer as transformers' CLIPTokenizer runs it without ftfy (the slow v4 path; Debian has
// no ftfy), from a tokenizer folder (vocab.json, merges.txt, and optionally special_tokens_map.json /
// tokenizer_config.json for the pad token and model_max_length):
//   1. the prompt is split on the literal special tokens <|startoftext|> / <|endoftext|>;
//   2. each piece is cleaned as BERT's BasicTokenizer does: NUL, U+FFFD and control / format
//      characters dropped, whitespace made ' ', spaces put around CJK ideographs, NFC, split on
//      whitespace, each word lower-cased (full Unicode), re-joined with single spaces;
//   3. pre-split: a special token, 's 't 're 've 'm 'll 'd, a run of letters, one number
//      character, or a run of anything else that is not a space;
//   4. each pre-token's UTF-8 bytes become byte symbols, '</w>' is glued to the last, and the
//      merges apply lowest rank first until none applies; the symbols are vocab ids.
// encode_padded() is FluxPipeline's call: <|startoftext|>, the first max_length - 2 ids,
// <|endoftext|>, then the pad id up to max_length (77).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace cubevec::tokenizers {

class ClipTokenizer {
 public:
  // `dir` holds vocab.json and merges.txt. Throws naming the file for anything missing or malformed.
  static ClipTokenizer load(const std::string& dir);

  // The ids of `prompt` without special tokens or padding. `what` names the prompt in errors.
  std::vector<int32_t> encode(const std::string& prompt, const std::string& what = "the prompt") const;
  // [bos] + the first max_length - 2 ids + [eos], right-padded with the pad id to max_length.
  // max_length 0: the folder's model_max_length (77 for CLIP-L).
  std::vector<int32_t> encode_padded(const std::string& prompt, int max_length = 0, const std::string& what = "the prompt") const;

  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }
  int model_max_length() const { return model_max_length_; }
  std::size_t vocab_size() const { return vocab_.size(); }

 private:
  std::vector<int32_t> bpe(const std::string& pre_token) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<std::string, int32_t> merge_ranks_;  // "a b" -> the merge's line index
  std::string source_;
  int32_t bos_id_ = 0, eos_id_ = 0, pad_id_ = 0;
  int model_max_length_ = 77;
};

}  // namespace cubevec::tokenizers
