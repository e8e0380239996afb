// The check every output flag (--out FILE, --json, --trace) carries, run by CLI11 while parsing:
// a path that cubevec could not write, or would have to destroy (a symlink, FIFO, directory,
// device or read-only file), is refused before any work starts (tensor/output_file.h); and an
// output may not be one of the command's inputs.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <string>

#include "tensor/error.h"

#include "tensor/output_file.h"

namespace cubevec::cli {

inline CLI::Validator output_file_path() {
  return CLI::Validator(
      [](std::string& path) {
        const std::string problem = output_path_problem(path);
        return problem.empty() ? std::string() : path + ": " + problem;
      },
      "FILE", "writable output file");
}

// Throws "<out_flag> <out>: is the <in_flag> file; ..." when the output would replace an input.
inline void refuse_output_over_input(const std::string& out_flag, const std::string& out, const std::string& in_flag, const std::string& in) {
  std::error_code ec;
  if (!out.empty() && !in.empty() && std::filesystem::equivalent(out, in, ec))
    throw Error(out_flag + " " + out + ": is the " + in_flag + " file; write the result to another path");
}

}  // namespace cubevec::cli
