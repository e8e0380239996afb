// libFuzzer target for the command line's argument handling: the input, split at NUL bytes, is an
// argv after `cubevec`, parsed by the same cli::CommandLine as the binary (every subcommand, its
// validators, the number checks and the outputs-against-inputs check) but never run. A parse that
// ends in an exit status, a runner, or a cubevec::Error (or a filesystem error, which main reports
// as an input error) is the contract; any other exception, a crash or a sanitizer report is a
// finding. Output paths are only examined (stat / access), never created.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/command_line.h"
#include "base/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  std::vector<std::string> args{"cubevec"};
  std::string current;
  for (std::size_t i = 0; i < size && args.size() < 64; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (!current.empty() && args.size() < 64) args.push_back(current);
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  cubevec::cli::CommandLine command_line;
  try {
    const cubevec::cli::ParsedCommand parsed = command_line.parse(static_cast<int>(argv.size()), argv.data());
    if (!parsed.run && parsed.exit_status != 0 && parsed.exit_status != 1) std::abort();  // only help (0) or an error line (1)
  } catch (const cubevec::Error& e) {
    if (e.what()[0] == '\0') std::abort();
  } catch (const std::filesystem::filesystem_error&) {
  }
  return 0;
}
