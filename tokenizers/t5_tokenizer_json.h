// A T5 / umT5 tokenizer.json (Hugging Face tokenizers' file, as transformers' T5Converter /
// SpmConverter writes it) turned into the SentencePiece Unigram model it was converted from, so
// T5Tokenizer runs it through libsentencepiece like spiece.model:
//   - model: {"type": "Unigram", "unk_id", "vocab": [[piece, score], ...], "byte_fallback"}; each
//     entry becomes a piece with its score and id. The piece at unk_id is UNKNOWN; </s>, <pad>,
//     <extra_id_N> and the special added_tokens are CONTROL (never matched in text: cubevec splits
//     them out of the prompt itself, as the slow T5Tokenizer does); the other added_tokens are
//     USER_DEFINED; <0xXX> pieces are BYTE when byte_fallback is true; the rest NORMAL. An added
//     token not in the vocabulary is appended when its id is the next one.
//   - normalizer: Precompiled{precompiled_charsmap: base64} gives the NormalizerSpec's charsmap
//     (its trie checked first so that libsentencepiece's unchecked walk stays inside it);
//     Strip and Replace(" {2,}" -> "▁" or " ") alone or in a Sequence, or null, are accepted; the
//     Replace (or a WhitespaceSplit pre-tokenizer) turns on remove_extra_whitespaces.
//   - pre_tokenizer: Metaspace("▁") with prepend_scheme "always" / "first" (or the older
//     add_prefix_space true) gives add_dummy_prefix, "never" / false none; alone or in a Sequence
//     after WhitespaceSplit.
//   - post_processor and decoder are not read (T5Tokenizer appends </s> itself).
// The file is read strictly (no repeated key) and at most 64 MiB (the cap of cubevec's JSON files).
// Anything else (a BPE model, another normalizer or pre-tokenizer, a bad vocabulary entry, no
// </s> / <pad> / <unk>, bad base64, a repeated piece) is an Error naming the file.
#pragma once

#include <string>
#include <string_view>

namespace cubevec::tokenizers {

// The serialized SentencePiece ModelProto for tokenizer.json at `path`.
std::string sentencepiece_model_from_tokenizer_json(const std::string& path);

// Standard base64 (RFC 4648 alphabet, '=' padding required, no whitespace, zero padding bits).
// Anything else throws an Error saying what and where, without a file name.
std::string decode_base64(std::string_view text);

}  // namespace cubevec::tokenizers
