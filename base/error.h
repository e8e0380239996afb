// cubevec's exception types. Every user-facing failure throws one of these with a message that
// says what was wrong, with which input, and what was expected.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace cubevec {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An allocation that would exceed the allocator's memory limit.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

// A number as a message shows it: shortest round-trip form ("1e-320", "0.3611"), not std::to_string's
// fixed six decimals that print a tiny value as 0.000000.
std::string number_for_message(double value);

// Text from outside (an environment variable, a name in a file) as a message quotes it: control
// bytes as \xHH (a NUL would end the message where C strings end) and, past 64 characters, the
// first 48 and the length, so that what follows it in the message (the accepted values) is still read.
std::string text_for_message(std::string_view text);

}  // namespace cubevec
