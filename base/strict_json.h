// JSON parsing for untrusted files: a repeated key is an error (instead of silently keeping the
// last value) and nesting is bounded, so a crafted file cannot exhaust the stack or the heap.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/error.h"

namespace cubevec {

class StrictJsonError : public Error {
 public:
  enum class Kind { Syntax, DuplicateKey, TooDeep };
  StrictJsonError(Kind kind, int depth, const std::string& message) : Error(message), kind_(kind), depth_(depth) {}
  Kind kind() const { return kind_; }
  int depth() const { return depth_; }  // of the duplicate key: 1 for a key of the top-level object

 private:
  Kind kind_;
  int depth_;
};

// True for a JSON integer that fits int64_t: nlohmann stores 2^63 .. 2^64 - 1 as unsigned, and
// get<int64_t>() would wrap such a value to a negative one (a range check then names the wrong number).
bool is_int64(const nlohmann::json& value);

// max_depth: deepest container allowed; the top-level value is at depth 0.
nlohmann::json parse_strict_json(std::string_view text, int max_depth);

// A config file (config.json, scheduler_config.json, ...) parsed strictly; an unreadable file or
// invalid JSON is an Error naming `path`.
nlohmann::json read_json_file(const std::string& path, int max_depth = 16);

}  // namespace cubevec
