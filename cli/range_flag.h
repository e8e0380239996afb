// The range check numeric flags carry, run by CLI11 while parsing. CLI11's own Range checks the
// range before the conversion, so `--frames abc` or `--steps 1.5` came out as "Value abc not in
// range 1 to 4097"; this one says what the value is not: an integer (or a finite number) in range.
// Integers are decimal only, as the environment's thread counts are.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>

namespace cubevec::cli {

template <class T>
std::string range_bound_text(T value) {
  if constexpr (std::is_integral_v<T>) {
    return std::to_string(value);
  } else {
    char text[32];
    std::snprintf(text, sizeof text, "%g", static_cast<double>(value));
    return text;
  }
}

template <class T>
CLI::Validator in_range(T lo, T hi) {
  static_assert(std::is_arithmetic_v<T>);
  const std::string expected = std::string(std::is_integral_v<T> ? "an integer" : "a finite number") + " from " + range_bound_text(lo) +
                               " to " + range_bound_text(hi);
  return CLI::Validator(
      [lo, hi, expected](std::string& value) -> std::string {
        T parsed{};
        if (!CLI::detail::lexical_cast(value, parsed)) return "'" + value + "' is not " + expected;
        if constexpr (std::is_integral_v<T>) {  // decimal only: CLI11 also reads 0x10, 0o20 and 0b10000
          std::size_t digits = value.find_first_not_of(' ');
          if (digits != std::string::npos && (value[digits] == '-' || value[digits] == '+')) ++digits;
          if (digits >= value.size() || value.find_first_not_of("0123456789", digits) != std::string::npos)
            return "'" + value + "' is not " + expected;
        }
        if constexpr (std::is_floating_point_v<T>) {
          if (!std::isfinite(parsed)) return "must be a finite number, got " + value;  // as the by-type check says it
        }
        if (parsed < lo || parsed > hi) return value + " is out of range: expected " + expected;
        return {};
      },
      "in [" + range_bound_text(lo) + " - " + range_bound_text(hi) + "]");
}

}  // namespace cubevec::cli
