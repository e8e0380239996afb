// A fast 64-bit hash of a byte range, for telling whether large data (a weight, a file's packed
// panels) is what it was: four independent multiply-rotate lanes over 32-byte blocks, then a
// final avalanche. Not cryptographic: it detects damage and change, not tampering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cubevec {

uint64_t content_hash(const void* data, std::size_t bytes, uint64_t seed = 0);
// 16 lowercase hex digits (what files record).
std::string hash_hex(uint64_t hash);

}  // namespace cubevec
