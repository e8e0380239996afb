#include "base/json_text.h"

#include <cstdio>

namespace cubevec {

namespace {

// The length of the UTF-8 sequence starting at text[i], or 0 when it is not one (overlong forms,
// surrogates and values above U+10FFFF are not UTF-8).
std::size_t utf8_sequence(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return 1;
  std::size_t length = 0;
  char32_t c = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) length = 2, c = b0 & 0x1F;
  else if (b0 >= 0xE0 && b0 <= 0xEF) length = 3, c = b0 & 0x0F;
  else if (b0 >= 0xF0 && b0 <= 0xF4) length = 4, c = b0 & 0x07;
  else return 0;
  if (i + length > text.size()) return 0;
  for (std::size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    c = (c << 6) | (byte(i + k) & 0x3F);
  }
  if ((length == 3 && c < 0x800) || (length == 4 && (c < 0x10000 || c > 0x10FFFF)) || (c >= 0xD800 && c <= 0xDFFF)) return 0;
  return length;
}

}  // namespace

std::string utf8_or_escaped(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    if (const std::size_t n = utf8_sequence(text, i); n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[i])));
      out += escaped;
      ++i;
    }
  }
  return out;
}

}  // namespace cubevec
