#include "tensor/half.h"

#include <cpuid.h>
#include <immintrin.h>

namespace cubevec {

uint16_t f32_to_f16(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);                          // >= 65520: rounds to inf
  const uint32_t exponent = abs >> 23;
  uint32_t quotient, remainder, halfway;
  if (exponent < 113) {                                      // below 2^-14: a half subnormal (or zero); the unit is 2^-24
    if (exponent < 102) return static_cast<uint16_t>(sign);  // below 2^-25: rounds to zero
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exponent;  // 14..24
    quotient = mantissa >> shift;
    remainder = mantissa & ((1u << shift) - 1);
    halfway = 1u << (shift - 1);
  } else {  // normal: re-bias the exponent from 127 to 15 and drop 13 mantissa bits
    const uint32_t rebased = abs - (112u << 23);
    quotient = rebased >> 13;
    remainder = rebased & 0x1fffu;
    halfway = 0x1000u;
  }
  // A carry out of the mantissa correctly bumps the exponent (subnormal -> normal, normal -> next).
  if (remainder > halfway || (remainder == halfway && (quotient & 1u))) ++quotient;
  return static_cast<uint16_t>(sign | quotient);
}

float f16_to_f32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) {  // inf or NaN; F16C also sets the quiet bit of a NaN
    const uint32_t quiet = mantissa ? 0x400000u : 0u;
    return std::bit_cast<float>(sign | 0x7f800000u | quiet | (mantissa << 13));
  }
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24 is exact in f32
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

bool cpu_has_f16c() {
  // CPUID leaf 1, ECX bit 29, read directly: clang 14's __builtin_cpu_supports has no "f16c".
  // "avx" also confirms the OS saves the YMM registers the F16C path uses.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0 && __builtin_cpu_supports("avx");
  }();
  return has;
}

namespace {

__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* src, uint16_t* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const uint16_t* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// bf16 -> f32 is a 16-bit shift; eight at a time (attention converts every bf16 row it packs).
__attribute__((target("avx2"))) void bf16_to_f32_avx2(const uint16_t* src, float* dst, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

// f32 -> bf16 exactly as f32_to_bf16 (nearest even, a NaN kept quiet), eight at a time: it was 4%
// of a bf16 attention call with few keys per query (its output rows), and bf16 activations convert
// through it everywhere.
__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float* src, uint16_t* dst, std::size_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000), one = _mm256_set1_epi32(1);
  const __m256i half_minus_one = _mm256_set1_epi32(0x7fff), quiet = _mm256_set1_epi32(0x40);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(half_minus_one, lsb)), 16);
    const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(_mm256_srli_epi32(x, 16), quiet), nan);
    // Each value is in [0, 0xffff], so the signed-to-unsigned saturating pack is exact; it packs
    // within 128-bit lanes, and the permute brings the two lanes' halves together.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

}  // namespace

void convert_f32_to_f16(const float* src, uint16_t* dst, std::size_t n) {
  if (cpu_has_f16c()) return f32_to_f16_f16c(src, dst, n);
  for (std::size_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void convert_f16_to_f32(const uint16_t* src, float* dst, std::size_t n) {
  if (cpu_has_f16c()) return f16_to_f32_f16c(src, dst, n);
  for (std::size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void convert_f32_to_bf16(const float* src, uint16_t* dst, std::size_t n) {
  if (cpu_has_avx2()) return f32_to_bf16_avx2(src, dst, n);
  for (std::size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void convert_bf16_to_f32(const uint16_t* src, float* dst, std::size_t n) {
  if (cpu_has_avx2()) return bf16_to_f32_avx2(src, dst, n);
  for (std::size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

}  // namespace cubevec
