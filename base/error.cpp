#include "base/error.h"

#include <charconv>

namespace cubevec {

std::string number_for_message(double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

}  // namespace cubevec
