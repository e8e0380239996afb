// cubevec's exception types. Every user-facing failure throws one of these with a message that
// says what was wrong, with which input, and what was expected.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

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

}  // namespace cubevec
