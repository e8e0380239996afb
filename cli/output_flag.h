// The check every output flag (--out FILE, --json, --trace) carries, run by CLI11 while parsing:
// a path that cubevec could not write, or would have to destroy (a symlink, FIFO, directory,
// device or read-only file), is refused before any work starts (base/output_file.h). Outputs
// against inputs: cli/output_overlap.h.
#pragma once

#include <CLI/CLI.hpp>

#include "base/output_file.h"

namespace cubevec::cli {

inline CLI::Validator output_file_path() {
  return CLI::Validator(
      [](std::string& path) {
        const std::string problem = output_path_problem(path);
        return problem.empty() ? std::string() : path + ": " + problem;
      },
      "FILE", "writable output file");
}

}  // namespace cubevec::cli
