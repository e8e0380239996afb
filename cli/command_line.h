// The `cubevec` command line as a library, so the binary and the argument fuzzer
// (tests/fuzz/cli_fuzzer.cpp) parse exactly alike: every subcommand registered, the number checks
// on every flag, the unknown-command message, and the outputs-against-inputs check after parsing.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <memory>
#include <string>

#include "cli/command.h"

namespace cubevec::cli {

struct ParsedCommand {
  CommandRunner run;    // the parsed subcommand; empty when parsing already decided the exit
  int exit_status = 0;  // without `run`: 0 after --help, 1 after an "error: ..." line on stderr
};

class CommandLine {
 public:
  CommandLine();
  // Parses argv (argv[0] is the program). Parse errors and help are printed here; the checks that
  // follow parsing throw cubevec::Error naming the flag. Never runs a subcommand.
  ParsedCommand parse(int argc, const char* const* argv);

 private:
  CLI::App app_{"cubevec: a PyTorch-free engine for diffusion transformers on an emulated Ascend device"};
  std::map<CLI::App*, CommandRunner> runners_;
  std::map<CLI::App*, std::shared_ptr<std::string>> tuning_files_;  // each subcommand's --tune-cache
};

}  // namespace cubevec::cli
