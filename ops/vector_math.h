// Branch-free float math written so the compiler vectorizes loops that use it (no library calls).
// The functions are `static inline` on purpose: this header is included by files compiled for
// different ISAs, and internal linkage keeps each file's copy to itself (an inline function with
// external linkage could be merged across them, running AVX-512 code on a CPU without it).
// They are also always_inline: a call GCC's inliner leaves out of line (it can give up in the large
// ISA files) keeps the loop around it from vectorizing.
#pragma once

#include <cstdint>
#include <cstring>

namespace cubevec::ops::vmath {

// exp(x) with about 2 ulp error over the float range; 0 below -87.3, large finite above 88.7.
[[gnu::always_inline]] static inline float exp(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
  // x = n ln2 + r with |r| <= ln2 / 2; n by round-to-nearest through the 1.5 * 2^23 trick.
  const float shifter = 12582912.0f;
  const float n = (x * 1.44269504088896341f + shifter) - shifter;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;  // ln2 split in two
  // exp(r) by its Taylor series to r^6 (|r| < 0.35: truncation below 1.3e-7 relative).
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // A NaN x gives a NaN p; n must not reach the int conversion as NaN (undefined behaviour).
  const float whole = n == n ? n : 0.0f;
  const int32_t bits = (static_cast<int32_t>(whole) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// tanh(x) = 1 - 2 / (exp(2x) + 1); saturates cleanly to +-1.
[[gnu::always_inline]] static inline float tanh(float x) { return 1.0f - 2.0f / (vmath::exp(2.0f * x) + 1.0f); }

[[gnu::always_inline]] static inline float silu(float x) { return x / (1.0f + vmath::exp(-x)); }

[[gnu::always_inline]] static inline float gelu_tanh(float x) {
  return 0.5f * x * (1.0f + vmath::tanh(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}

}  // namespace cubevec::ops::vmath
