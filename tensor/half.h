// Exact conversions between f32 and the 16-bit float formats (IEEE binary16 and bfloat16).
// f32 -> 16-bit rounds to nearest, ties to even; NaN stays NaN (quieted, sign kept), values past
// the largest finite half round to infinity. 16-bit -> f32 is exact.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace cubevec {

uint16_t f32_to_f16(float value);
float f16_to_f32(uint16_t bits);

inline uint16_t f32_to_bf16(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);                                    // ties to even
  return static_cast<uint16_t>((x + rounding) >> 16);
}

inline float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

// Bulk conversions; the f16 ones use the F16C instructions when the CPU has them (same results).
void convert_f32_to_f16(const float* src, uint16_t* dst, std::size_t n);
void convert_f16_to_f32(const uint16_t* src, float* dst, std::size_t n);
void convert_f32_to_bf16(const float* src, uint16_t* dst, std::size_t n);
void convert_bf16_to_f32(const uint16_t* src, float* dst, std::size_t n);

// True when convert_f*_f16 take the F16C path on this CPU.
bool cpu_has_f16c();

}  // namespace cubevec
