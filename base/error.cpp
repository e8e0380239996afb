#include "base/error.h"

#include <charconv>

namespace cubevec {

std::string number_for_message(double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

std::string text_for_message(std::string_view text) {
  constexpr std::size_t kMaxShown = 64, kShownWhenLong = 48;
  std::string shown;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x20 && byte != 0x7f) {
      shown += text[i];
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      shown += {'\\', 'x', kHex[byte >> 4], kHex[byte & 15]};
    }
    if (shown.size() > kMaxShown) {
      shown.resize(kShownWhenLong);
      return shown + "... (" + std::to_string(text.size()) + " bytes)";
    }
  }
  return shown;
}

}  // namespace cubevec
