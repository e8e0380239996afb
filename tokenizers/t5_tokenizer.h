// T5's and umT5's tokenizer as transformers' slow T5Tokenizer runs it (legacy mode), from a
// tokenizer folder with spiece.model (a SentencePiece Unigram model, read by Debian's
// libsentencepiece) or, when there is none, tokenizer.json (Hugging Face tokenizers' file, as
// transformers' T5Converter writes it: the Unigram model it holds is rebuilt as a SentencePiece
// model in memory and run by the same library, see t5_tokenizer_json.h), and optionally
// tokenizer_config.json (extra_ids, model_max_length):
//   - the special tokens typed in the prompt (</s>, <pad>, <unk>, <extra_id_N>) are split out
//     first, whitespace around <extra_id_N> dropped; each remaining piece is SentencePiece-encoded
//     on its own (so each gets its own leading "▁");
//   - <extra_id_N> is the piece of that name when the model has one, else id
//     pieces + extra_ids - 1 - N (T5: 32,100 ids, <extra_id_0> = 32099);
//   - encode_padded() is FluxPipeline's and WanPipeline's call: the first max_length - 1 ids, </s>,
//     then <pad> up to max_length, with the attention mask (1 for the ids and </s>).
// From tokenizer.json, cubevec still follows SentencePiece (the slow tokenizer), not the Rust
// tokenizers library, where the two differ: HF's Precompiled normalizer walks graphemes and takes
// the shortest charsmap match, SentencePiece the longest; the whitespace rules are SentencePiece's
// (leading, trailing and repeated spaces dropped when the file has the " {2,}" Replace or a
// WhitespaceSplit); prepend_scheme "first" is taken as "always" (each piece between special
// tokens gets its "▁", as in legacy mode); and the <extra_id_N> entries are CONTROL pieces, which
// only cubevec's special-token split gives (so an <extra_id_N> beyond tokenizer_config.json's
// extra_ids is text, as with spiece.model).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace cubevec::tokenizers {

struct PaddedIds {
  std::vector<int32_t> ids;
  std::vector<int32_t> attention_mask;  // 1 for a token (and </s>), 0 for padding
};

class T5Tokenizer {
 public:
  // `dir` holds spiece.model or tokenizer.json. Throws naming the file for anything missing or malformed.
  static T5Tokenizer load(const std::string& dir);
  ~T5Tokenizer();
  T5Tokenizer(T5Tokenizer&&) noexcept;
  T5Tokenizer& operator=(T5Tokenizer&&) noexcept;

  // The ids of `prompt`, special tokens included as typed, without </s> or padding.
  std::vector<int32_t> encode(const std::string& prompt, const std::string& what = "the prompt") const;
  PaddedIds encode_padded(const std::string& prompt, int max_length, const std::string& what = "the prompt") const;

  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }
  int32_t unk_id() const { return unk_id_; }
  int vocab_size() const;  // pieces + extra ids that are not pieces
  int32_t extra_id(int n) const;

 private:
  T5Tokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string source_;
  int extra_ids_ = 100;
  int32_t eos_id_ = 1, pad_id_ = 0, unk_id_ = 2;
};

}  // namespace cubevec::tokenizers
