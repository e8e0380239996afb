#include "cli/number_checks.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace cubevec::cli {

namespace {

CLI::Validator finite_number() {
  CLI::Validator v(
      [](std::string& text) {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (end != text.c_str() && !std::isfinite(value)) return "must be a finite number, got " + text;
        return std::string();  // not a number at all: CLI11's conversion says so
      },
      "");
  return v;
}

CLI::Validator non_negative_integer() {
  CLI::Validator v(
      [](std::string& text) {
        const std::size_t first = text.find_first_not_of(" \t");
        if (first != std::string::npos && text[first] == '-') return "must not be negative, got " + text;
        errno = 0;
        (void)std::strtoull(text.c_str(), nullptr, 10);
        if (errno == ERANGE) return "must be below 2^64, got " + text;  // CLI11 2.1 saturates silently
        return std::string();
      },
      "");
  return v;
}

}  // namespace

void add_number_checks(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    // "FLOAT", or "FLOAT:FLOAT in [0 - 100]" once a range is attached.
    const std::string type = option->get_type_name();
    if (type.rfind("FLOAT", 0) == 0) option->check(finite_number());
    else if (type.rfind("UINT", 0) == 0) option->check(non_negative_integer());
  }
  for (CLI::App* sub : app.get_subcommands({})) add_number_checks(*sub);
}

}  // namespace cubevec::cli
