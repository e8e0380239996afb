// Loads and stores of f32 / bf16 elements, and lane-parallel reductions, for the vector kernels.
// Included only by ops/vector/isa_*.cpp, each compiled for its own ISA: everything here has
// internal linkage (an anonymous namespace) and uses no standard-library inline code, so no copy
// compiled for a wider ISA can be merged into code that runs on a narrower one.
#pragma once

#include <cstdint>

#include "ops/vector/kernels.h"

namespace cubevec::ops::vk {
namespace {

using bf16_t = uint16_t;  // in these kernels a uint16_t element is always bf16

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const bf16_t* p, int64_t i) { return __builtin_bit_cast(float, static_cast<uint32_t>(p[i]) << 16); }

inline void store(float* p, int64_t i, float v) { p[i] = v; }
// Round to nearest, ties to even; a NaN stays a (quiet) NaN. Branch-free so loops vectorize.
inline void store(bf16_t* p, int64_t i, float v) {
  const uint32_t bits = __builtin_bit_cast(uint32_t, v);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t nan = (bits >> 16) | 0x40u;
  p[i] = static_cast<bf16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

inline float min_f(float a, float b) { return a < b ? a : b; }
inline float max_f(float a, float b) { return a > b ? a : b; }
inline float abs_f(float a) { return __builtin_fabsf(a); }
inline float sqrt_f(float a) { return __builtin_sqrtf(a); }

// Before a loop whose input and output rows never overlap: GCC does not always apply __restrict
// to row pointers computed inside the kernels, versions such loops with a runtime overlap check,
// and that check can send the whole loop down its scalar path.
#if defined(__GNUC__) && !defined(__clang__)
#define CUBEVEC_NO_ALIAS _Pragma("GCC ivdep")
#else
#define CUBEVEC_NO_ALIAS
#endif

// Row `x` of n values as f32: the row itself for f32, else converted into `buf` (room for n).
inline const float* as_f32(const float* x, int64_t, float*) { return x; }
inline const float* as_f32(const bf16_t* __restrict x, int64_t n, float* __restrict buf) {
  for (int64_t i = 0; i < n; ++i) buf[i] = load(x, i);
  return buf;
}

// Reductions keep kLanes independent partial results (one or more vector registers), so they
// vectorize without reassociating a single sum; the tail and the final fold are scalar.
constexpr int64_t kLanes = 16;

// sum over i of f(load(x, i)).
template <class T, class F>
inline float reduce_sum(const T* x, int64_t n, F f) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) acc[j] += f(load(x, i + j));
  float tail = 0;
  for (; i < n; ++i) tail += f(load(x, i));
  for (int64_t j = 0; j < kLanes; j += 2) acc[j] += acc[j + 1];
  for (int64_t j = 0; j < kLanes; j += 4) acc[j] += acc[j + 2];
  for (int64_t j = 0; j < kLanes; j += 8) acc[j] += acc[j + 4];
  return acc[0] + acc[8] + tail;
}

template <class T>
inline float reduce_max(const T* x, int64_t n) {
  float acc[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) acc[j] = -__builtin_inff();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) acc[j] = max_f(acc[j], load(x, i + j));
  float m = -__builtin_inff();
  for (; i < n; ++i) m = max_f(m, load(x, i));
  for (int64_t j = 0; j < kLanes; ++j) m = max_f(m, acc[j]);
  return m;
}

}  // namespace
}  // namespace cubevec::ops::vk
