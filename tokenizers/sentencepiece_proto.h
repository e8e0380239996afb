// A SentencePiece Unigram model written as the protobuf bytes libsentencepiece's
// LoadFromSerializedProto reads (sentencepiece_model.proto, proto2), so a model described by some
// other file (a Hugging Face tokenizer.json) runs through the same library as spiece.model.
// Only what encoding needs is written: the pieces, TrainerSpec's model type, byte fallback and
// special ids, and the NormalizerSpec. Field numbers, from sentencepiece_model.proto:
//   ModelProto      pieces = 1, trainer_spec = 2, normalizer_spec = 3
//   SentencePiece   piece = 1 (string), score = 2 (float), type = 3 (enum)
//   TrainerSpec     model_type = 3 (UNIGRAM = 1), byte_fallback = 35, unk_id = 40, bos_id = 41,
//                   eos_id = 42, pad_id = 43
//   NormalizerSpec  name = 1, precompiled_charsmap = 2 (bytes), add_dummy_prefix = 3,
//                   remove_extra_whitespaces = 4, escape_whitespaces = 5
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cubevec::tokenizers {

struct SentencePieceEntry {
  // ModelProto.SentencePiece.Type
  enum class Type : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };
  std::string piece;
  float score = 0.0f;
  Type type = Type::Normal;
};

struct UnigramModelSpec {
  std::vector<SentencePieceEntry> pieces;
  bool byte_fallback = false;
  int32_t unk_id = 0, bos_id = -1, eos_id = -1, pad_id = -1;  // -1: none
  std::string normalizer_name;
  std::string precompiled_charsmap;  // empty: no character normalization
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

// The serialized ModelProto (model_type UNIGRAM).
std::string serialize_unigram_model(const UnigramModelSpec& spec);

}  // namespace cubevec::tokenizers
