// Checks every numeric flag of every command gets, attached in main() by the flag's type:
// floating-point values must be finite (CLI11 accepts "nan" and "inf"), and unsigned integers may
// not be negative (CLI11 2.1 turns "--seed -1" into 2^64 - 1 silently).
#pragma once

#include <CLI/CLI.hpp>

namespace cubevec::cli {

// Adds the checks to every option of `app` and of its subcommands, by CLI11's type name.
void add_number_checks(CLI::App& app);

}  // namespace cubevec::cli
