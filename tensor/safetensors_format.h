// The safetensors file format: dtype names and the header parser that validates a whole file
// image before any tensor byte is touched (the rules of the reference Rust reader, plus duplicate
// names, which it lets through). See docs/robustness.md, "The safetensors rules".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"
#include "base/error.h"

namespace cubevec {

// Which rule a malformed file broke; names follow the reference reader's errors.
enum class SafetensorsRule {
  HeaderTooSmall,       // fewer than 8 bytes
  HeaderTooLarge,       // header length above 100,000,000
  InvalidHeaderLength,  // header runs past the end of the file
  InvalidUtf8,          // header bytes are not UTF-8
  InvalidJson,          // not JSON, or not a JSON object
  InvalidMetadata,      // __metadata__ is not a string -> string object
  InvalidEntry,         // entry is not an object, or lacks dtype / shape / data_offsets
  UnknownDtype,         // dtype string not in the format's list
  InvalidShape,         // shape is not an array of non-negative integers
  InvalidOffsets,       // data_offsets is not two non-negative integers
  DuplicateName,        // the same tensor name twice
  InvalidOffset,        // spans not sorted and contiguous from 0 (gap, overlap, end < begin)
  ValidationOverflow,   // element count or bit count overflows
  MisalignedSlice,      // bit count not a multiple of 8 (F4, F6)
  TensorInvalidInfo,    // byte span differs from shape x dtype size
  IncompleteBuffer,     // data section length differs from the spans' total
};

std::string_view rule_name(SafetensorsRule rule);

class SafetensorsError : public Error {
 public:
  SafetensorsError(std::string file, std::string tensor, SafetensorsRule rule, const std::string& detail);
  const std::string& file() const { return file_; }
  const std::string& tensor() const { return tensor_; }  // empty when the error is not about one tensor
  SafetensorsRule rule() const { return rule_; }

 private:
  std::string file_;
  std::string tensor_;
  SafetensorsRule rule_;
};

// A dtype string of the format, its size in bits, and the cubevec DType it maps to (if any).
struct SafetensorsDtype {
  std::string_view name;
  uint32_t bits;
  std::optional<DType> dtype;
};

// nullptr when `name` is not a safetensors dtype.
const SafetensorsDtype* find_safetensors_dtype(std::string_view name);
// The format's name for a cubevec DType ("F32", "BF16", "BOOL", ...).
std::string_view safetensors_dtype_name(DType dtype);
// The dtype's alignment rank in the format (its position in the declaration order); the reference
// writer puts higher ranks first.
int safetensors_dtype_rank(DType dtype);

struct SafetensorsEntry {
  std::string name;
  const SafetensorsDtype* dtype;
  std::vector<uint64_t> shape;
  uint64_t begin;  // relative to the data section
  uint64_t end;    // exclusive
};

struct SafetensorsHeader {
  uint64_t header_length = 0;  // N, the JSON's byte length
  uint64_t data_start = 0;     // 8 + N
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsEntry> entries;  // sorted by data offset
};

inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

// Validates the whole file image and returns its header; throws SafetensorsError naming `file_name`.
SafetensorsHeader parse_safetensors(std::span<const std::byte> file, const std::string& file_name);
// The same through the DOM-based strict path only: parse_safetensors takes a one-pass fast path
// for well-formed headers and falls back to this for anything else, so both give the same header
// or the same error (tests compare them).
SafetensorsHeader parse_safetensors_strict(std::span<const std::byte> file, const std::string& file_name);

}  // namespace cubevec
