// Element types of cubevec tensors: their size, their name, and parsing from a name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cubevec {

enum class DType : uint8_t { f32, f16, bf16, i8, u8, i32, i64, boolean };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::i8, DType::u8, DType::i32, DType::i64, DType::boolean};

// Bytes per element.
std::size_t dtype_size(DType dtype);

// Lower-case name as cubevec prints it: "f32", "bf16", "bool", ...
std::string_view dtype_name(DType dtype);

// Inverse of dtype_name; throws cubevec::Error listing the known names.
DType parse_dtype(std::string_view name);

bool is_floating(DType dtype);

// Maps a C++ element type to its DType (float -> f32, ...). Half types are stored as uint16_t and
// have no mapping here: their DType is always given explicitly.
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<int8_t>() {
  return DType::i8;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::boolean;
}

}  // namespace cubevec
