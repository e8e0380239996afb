#include "cli/error_line.h"

#include <cstdio>

namespace cubevec::cli {

namespace {

std::size_t utf8_sequence_length(const std::string& s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const std::size_t n = b0 >= 0xF0 && b0 <= 0xF4 ? 4 : b0 >= 0xE0 && b0 <= 0xEF ? 3 : b0 >= 0xC2 && b0 <= 0xDF ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  return n;
}

}  // namespace

std::string one_line(const std::string& message) {
  constexpr std::size_t kMaxLength = 1000;
  std::string out;
  std::size_t i = 0;
  for (; i < message.size() && out.size() < kMaxLength; ++i) {
    const auto c = static_cast<unsigned char>(message[i]);
    if (c == '\n') {
      out += "; ";
      while (i + 1 < message.size() && message[i + 1] == ' ') ++i;  // the indentation of a listed item
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && utf8_sequence_length(message, i) == 0)) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else if (c >= 0x80) {
      const std::size_t n = utf8_sequence_length(message, i);
      out.append(message, i, n);
      i += n - 1;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (i < message.size()) out += " ... (" + std::to_string(message.size() - i) + " more bytes)";
  return out;
}

}  // namespace cubevec::cli
