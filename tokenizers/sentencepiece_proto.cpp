#include "tokenizers/sentencepiece_proto.h"

#include <bit>

namespace cubevec::tokenizers {

namespace {

// The protobuf wire format: a key is (field << 3 | wire type); 0 is a varint, 2 a length-prefixed
// run of bytes, 5 four little-endian bytes.
constexpr uint32_t kVarint = 0, kLengthDelimited = 2, kFixed32 = 5;

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, uint32_t field, uint32_t wire_type) { put_varint(out, uint64_t{field} << 3 | wire_type); }

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// int32 and enum fields: a negative value is sign-extended to 64 bits (ten bytes), as protobuf does.
void put_int32(std::string& out, uint32_t field, int32_t value) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(static_cast<int64_t>(value)));
}

void put_bool(std::string& out, uint32_t field, bool value) {
  put_key(out, field, kVarint);
  put_varint(out, value ? 1 : 0);
}

void put_float(std::string& out, uint32_t field, float value) {
  put_key(out, field, kFixed32);
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<char>((bits >> shift) & 0xFF));
}

}  // namespace

std::string serialize_unigram_model(const UnigramModelSpec& spec) {
  std::string out;
  for (const SentencePieceEntry& p : spec.pieces) {
    std::string piece;
    put_bytes(piece, 1, p.piece);
    put_float(piece, 2, p.score);
    put_int32(piece, 3, static_cast<int32_t>(p.type));
    put_bytes(out, 1, piece);  // ModelProto.pieces
  }
  std::string trainer;
  put_int32(trainer, 3, 1);                                         // model_type: UNIGRAM
  put_int32(trainer, 4, static_cast<int32_t>(spec.pieces.size()));  // vocab_size (informational)
  put_bool(trainer, 35, spec.byte_fallback);
  put_int32(trainer, 40, spec.unk_id);
  put_int32(trainer, 41, spec.bos_id);
  put_int32(trainer, 42, spec.eos_id);
  put_int32(trainer, 43, spec.pad_id);
  put_bytes(out, 2, trainer);  // ModelProto.trainer_spec
  std::string normalizer;
  put_bytes(normalizer, 1, spec.normalizer_name);
  if (!spec.precompiled_charsmap.empty()) put_bytes(normalizer, 2, spec.precompiled_charsmap);
  put_bool(normalizer, 3, spec.add_dummy_prefix);
  put_bool(normalizer, 4, spec.remove_extra_whitespaces);
  put_bool(normalizer, 5, spec.escape_whitespaces);
  put_bytes(out, 3, normalizer);  // ModelProto.normalizer_spec
  return out;
}

}  // namespace cubevec::tokenizers
