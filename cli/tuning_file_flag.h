// --tune-cache FILE, accepted by every subcommand: the GEMM calibration's tuning file for this run
// instead of $XDG_CACHE_HOME/cubevec/tuning.json. Checked and read before any work (a malformed
// file or a path that cannot become a regular file is an error naming it); measurements made during
// the run are written back to it.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

namespace cubevec::cli {

std::shared_ptr<std::string> add_tuning_file_flag(CLI::App& command);

// Makes `path` the tuning file (nothing for an empty path: the default file is used on first need).
// A read-only file is used as it is, with a note; where the command exists to write it (`tune`),
// it is refused instead, and so is a run on the AMX tile model (which saves nothing).
void use_tuning_file(const std::string& path, bool command_writes_it = false);

}  // namespace cubevec::cli
