// f16 / bf16 conversions against references written independently of tensor/half.cpp:
// decoding by ldexp arithmetic, encoding by searching for the nearest representable value.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "tensor/half.h"

namespace cubevec {
namespace half_test {  // named after the file: unity batches never mix two files' helpers

// Value of an IEEE binary16 bit pattern, from the definition.
double decode_f16(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0x1f) return mantissa ? std::nan("") : sign * std::numeric_limits<double>::infinity();
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// All finite non-negative halves in increasing order of value (bit order is value order).
std::vector<double> positive_f16_values() {
  std::vector<double> values;
  for (uint32_t h = 0; h < 0x7c00; ++h) values.push_back(decode_f16(static_cast<uint16_t>(h)));
  return values;
}

// Nearest half to x by search; ties go to the even bit pattern; beyond the top, IEEE overflow rules.
uint16_t reference_f32_to_f16(float x, const std::vector<double>& table) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (std::isinf(x)) return sign | 0x7c00;
  const double max_half = 65504.0, next_up = 65536.0;  // overflow threshold is their midpoint
  if (a >= (max_half + next_up) / 2) return sign | 0x7c00;
  auto hi = std::lower_bound(table.begin(), table.end(), a);
  if (hi == table.end()) return sign | 0x7bff;
  if (*hi == a || hi == table.begin()) return sign | static_cast<uint16_t>(hi - table.begin());
  auto lo = hi - 1;
  const double d_lo = a - *lo, d_hi = *hi - a;
  uint16_t pick = static_cast<uint16_t>((d_lo < d_hi ? lo : hi) - table.begin());
  if (d_lo == d_hi) pick = static_cast<uint16_t>(((lo - table.begin()) % 2 == 0 ? lo : hi) - table.begin());
  return sign | pick;
}

uint16_t reference_f32_to_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint16_t down = static_cast<uint16_t>(bits >> 16);
  const double value = x;
  const double lower = std::bit_cast<float>(static_cast<uint32_t>(down) << 16);
  // The next bf16 above `down` in magnitude; for the largest finite, that is infinity.
  const uint16_t up = static_cast<uint16_t>(down + 1);
  const double upper = std::bit_cast<float>(static_cast<uint32_t>(up) << 16);
  if (value == lower) return down;
  const double d_lo = std::fabs(value - lower), d_hi = std::fabs(upper - value);
  if ((up & 0x7f80) == 0x7f80) {  // rounding up would overflow: the overflow threshold is the midpoint
    const double top = lower, ulp = std::fabs(std::ldexp(1.0, 127 - 7));
    return std::fabs(value) >= std::fabs(top) + ulp / 2 ? up : down;
  }
  if (d_lo < d_hi) return down;
  if (d_hi < d_lo) return up;
  return (down & 1) ? up : down;
}

std::vector<float> interesting_floats() {
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           1.0f,
                           -1.0f,
                           65504.0f,
                           65519.99f,
                           65520.0f,
                           65536.0f,
                           1e10f,
                           -1e10f,
                           INFINITY,
                           -INFINITY,
                           0x1p-24f,
                           0x1p-25f,
                           0x1.8p-25f,
                           0x1p-26f,
                           0x1p-14f,
                           0x1.ffcp-15f,
                           std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::min(),
                           3.14159265f,
                           1.0f / 3.0f};
  // Every midpoint between neighbouring halves (exact ties) and the floats just beside it.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const float mid = static_cast<float>((decode_f16(static_cast<uint16_t>(h)) + decode_f16(static_cast<uint16_t>(h + 1))) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(bits(rng));
    if (!std::isnan(x)) xs.push_back(x);
  }
  std::uniform_real_distribution<float> small(-70000.0f, 70000.0f);
  for (int i = 0; i < 200000; ++i) xs.push_back(small(rng));
  return xs;
}

TEST(Half, F16ToF32AllPatternsMatchDefinition) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> bulk(all.size());
  convert_f16_to_f32(all.data(), bulk.data(), all.size());
  for (uint32_t h = 0; h < 65536; ++h) {
    const double expected = decode_f16(static_cast<uint16_t>(h));
    const float scalar = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(scalar)) << std::hex << h;
      EXPECT_EQ(std::signbit(scalar), (h & 0x8000) != 0) << std::hex << h;
    } else {
      EXPECT_EQ(static_cast<double>(scalar), expected) << std::hex << h;
      EXPECT_EQ(std::signbit(scalar), (h & 0x8000) != 0) << std::hex << h;  // -0 stays -0
    }
    EXPECT_EQ(std::bit_cast<uint32_t>(bulk[h]), std::bit_cast<uint32_t>(scalar)) << "bulk path differs at " << std::hex << h;
  }
}

TEST(Half, F16RoundTripsEveryPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = f32_to_f16(f16_to_f32(static_cast<uint16_t>(h)));
    const bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
    if (is_nan) {
      EXPECT_EQ(back & 0x7e00, 0x7e00) << "NaN must stay a quiet NaN: " << std::hex << h;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << std::hex << h;
    } else {
      EXPECT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(Half, F32ToF16RoundsToNearestEven) {
  const auto table = positive_f16_values();
  const auto xs = interesting_floats();
  std::vector<uint16_t> bulk(xs.size());
  convert_f32_to_f16(xs.data(), bulk.data(), xs.size());
  int failures = 0;
  for (std::size_t i = 0; i < xs.size() && failures < 20; ++i) {
    const uint16_t expected = reference_f32_to_f16(xs[i], table);
    const uint16_t got = f32_to_f16(xs[i]);
    if (got != expected || bulk[i] != expected) {
      ++failures;
      ADD_FAILURE() << "x=" << std::hexfloat << xs[i] << " expected 0x" << std::hex << expected << " scalar 0x" << got << " bulk 0x"
                    << bulk[i];
    }
  }
}

TEST(Half, F32ToF16NaNStaysNaN) {
  for (uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fbfffffu, 0xff812345u}) {
    const float x = std::bit_cast<float>(bits);
    const uint16_t h = f32_to_f16(x);
    EXPECT_EQ(h & 0x7c00, 0x7c00);
    EXPECT_NE(h & 0x3ff, 0) << "NaN became infinity for 0x" << std::hex << bits;
    EXPECT_EQ(h & 0x8000, (bits >> 16) & 0x8000);
    uint16_t bulk;
    convert_f32_to_f16(&x, &bulk, 1);
    EXPECT_EQ(bulk & 0x7c00, 0x7c00);
    EXPECT_NE(bulk & 0x3ff, 0);
  }
}

TEST(Half, Bf16ToF32AllPatterns) {
  std::vector<uint16_t> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = static_cast<uint16_t>(b);
  std::vector<float> bulk(all.size());
  convert_bf16_to_f32(all.data(), bulk.data(), all.size());
  for (uint32_t b = 0; b < 65536; ++b) {
    // bf16 is the top half of an f32: its value by definition, from sign, exponent and mantissa.
    const int exponent = (b >> 7) & 0xff, mantissa = b & 0x7f;
    const double sign = (b & 0x8000) ? -1.0 : 1.0;
    const float got = bf16_to_f32(static_cast<uint16_t>(b));
    EXPECT_EQ(std::bit_cast<uint32_t>(bulk[b]), std::bit_cast<uint32_t>(got));
    if (exponent == 0xff) {
      EXPECT_EQ(std::isnan(got), mantissa != 0) << std::hex << b;
      continue;
    }
    const double expected = exponent == 0 ? sign * std::ldexp(mantissa, -133) : sign * std::ldexp(128 + mantissa, exponent - 134);
    EXPECT_EQ(static_cast<double>(got), expected) << std::hex << b;
    EXPECT_EQ(f32_to_bf16(got), b) << "round trip " << std::hex << b;
  }
}

TEST(Half, F32ToBf16RoundsToNearestEven) {
  auto xs = interesting_floats();
  // Exact ties between neighbouring bf16 values, both parities, and around the overflow threshold.
  for (uint32_t top : {0x3f80u, 0x3f81u, 0x0001u, 0x7f7eu, 0x7f7fu, 0x8001u, 0xc2f7u})
    for (uint32_t low : {0x8000u, 0x7fffu, 0x8001u, 0xffffu, 0x0001u}) xs.push_back(std::bit_cast<float>((top << 16) | low));
  std::vector<uint16_t> bulk(xs.size());
  convert_f32_to_bf16(xs.data(), bulk.data(), xs.size());
  int failures = 0;
  for (std::size_t i = 0; i < xs.size() && failures < 20; ++i) {
    const uint16_t expected = reference_f32_to_bf16(xs[i]);
    if (f32_to_bf16(xs[i]) != expected || bulk[i] != expected) {
      ++failures;
      ADD_FAILURE() << "x=" << std::hexfloat << xs[i] << " expected 0x" << std::hex << expected << " got 0x" << f32_to_bf16(xs[i]);
    }
  }
}

TEST(Half, F32ToBf16NaNStaysNaN) {
  const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu,
                           0x7f80ffffu, 0xffc00001u, 0x7fbfffffu, 0xff8f0000u};
  std::vector<float> xs;
  for (uint32_t bits : nans) xs.push_back(std::bit_cast<float>(bits));
  std::vector<uint16_t> bulk(xs.size());
  convert_f32_to_bf16(xs.data(), bulk.data(), xs.size());  // eight through the vector path where there is one, one after it
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const uint32_t bits = nans[i];
    for (const uint16_t b : {f32_to_bf16(xs[i]), bulk[i]}) {
      EXPECT_EQ(b & 0x7f80, 0x7f80);
      EXPECT_NE(b & 0x7f, 0) << "NaN became infinity for 0x" << std::hex << bits;
      EXPECT_EQ(b & 0x8000, (bits >> 16) & 0x8000);
    }
  }
}

// The bulk conversion (eight at a time where the CPU has AVX2) against the scalar one, bit for bit,
// on random bit patterns of every kind, at lengths that end inside and past a vector.
TEST(Half, F32ToBf16BulkMatchesScalarOnRandomBits) {
  std::mt19937 rng(11);
  for (const std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{8}, std::size_t{13}, std::size_t{4099}}) {
    std::vector<float> xs(n);
    for (float& x : xs) x = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    std::vector<uint16_t> bulk(n + 1, 0xabcd);
    convert_f32_to_bf16(xs.data(), bulk.data(), n);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(bulk[i], f32_to_bf16(xs[i])) << std::hex << std::bit_cast<uint32_t>(xs[i]);
    EXPECT_EQ(bulk[n], 0xabcd) << "wrote past the end";
  }
}

}  // namespace half_test
}  // namespace cubevec
