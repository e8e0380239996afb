#include "base/content_hash.h"

#include <cstring>

namespace cubevec {

namespace {

constexpr uint64_t kMultiplierA = 0x9E3779B185EBCA87ull;  // odd constants with well-spread bits
constexpr uint64_t kMultiplierB = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kMultiplierC = 0x165667B19E3779F9ull;

uint64_t rotate_left(uint64_t v, int bits) { return (v << bits) | (v >> (64 - bits)); }

uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);  // any alignment; the byte order is the machine's (little-endian x86)
  return v;
}

uint64_t lane_step(uint64_t lane, uint64_t word) { return rotate_left(lane + word * kMultiplierB, 31) * kMultiplierA; }

// Every input bit reaches every output bit (a 64-bit finalizer: xor-shift and multiply, twice).
uint64_t avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kMultiplierB;
  h ^= h >> 29;
  h *= kMultiplierC;
  h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t content_hash(const void* data, std::size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t lanes[4] = {seed + kMultiplierA + kMultiplierB, seed + kMultiplierB, seed, seed - kMultiplierA};
  std::size_t i = 0;
  for (; i + 32 <= bytes; i += 32)
    for (int l = 0; l < 4; ++l) lanes[l] = lane_step(lanes[l], load64(p + i + 8 * l));
  uint64_t h = rotate_left(lanes[0], 1) + rotate_left(lanes[1], 7) + rotate_left(lanes[2], 12) + rotate_left(lanes[3], 18);
  for (int l = 0; l < 4; ++l) h = (h ^ lane_step(0, lanes[l])) * kMultiplierA + kMultiplierC;
  h += static_cast<uint64_t>(bytes);
  for (; i + 8 <= bytes; i += 8) h = rotate_left(h ^ lane_step(0, load64(p + i)), 27) * kMultiplierA + kMultiplierC;
  for (; i < bytes; ++i) h = rotate_left(h ^ (p[i] * kMultiplierC), 11) * kMultiplierA;
  return avalanche(h);
}

std::string hash_hex(uint64_t hash) {
  static const char digits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, hash >>= 4) out[static_cast<std::size_t>(i)] = digits[hash & 15];
  return out;
}

}  // namespace cubevec
