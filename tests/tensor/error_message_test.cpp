// How messages quote text from outside (base/error.h text_for_message, base/enum_names.h).
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "base/enum_names.h"
#include "base/error.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace error_message_test {

using testing::message_of;

// Text from outside is quoted escaped and, when long, cut before the rest of the message.
TEST(ErrorMessages, OutsideTextIsEscapedAndShortened) {
  EXPECT_EQ(text_for_message("avx2"), "avx2");
  EXPECT_EQ(text_for_message(std::string_view("a\0b\n\x7f", 5)), "a\\x00b\\x0a\\x7f");
  const std::string long_text(5000, 'z');
  EXPECT_EQ(text_for_message(long_text), std::string(48, 'z') + "... (5000 bytes)");
  EXPECT_EQ(text_for_message(std::string(64, 'y')), std::string(64, 'y')) << "64 characters are shown whole";
  // An unknown name of any length still lists the accepted ones.
  enum class Color { red, blue };
  constexpr auto kColors = enum_names<Color>("color", {{Color::red, "red"}, {Color::blue, "blue"}});
  EXPECT_EQ(message_of([&] { kColors.parse(long_text); }),
            "unknown color '" + std::string(48, 'z') + "... (5000 bytes)' (expected one of: red, blue)");
}

}  // namespace error_message_test
}  // namespace cubevec
