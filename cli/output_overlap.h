// After parsing, before any work: no output of the command may be one of its inputs, lie inside
// an input folder (the model's weights and configs), or be another output of the same run
// (`--json` equal to `--out`). Outputs are the values of --out (a file; quantize's --out folder
// is left out), --json, --trace and --attn-tune-cache (read, then rewritten); every other option
// or positional naming an existing file or folder is an input.
#pragma once

#include <CLI/CLI.hpp>

namespace cubevec::cli {

// Throws cubevec::Error naming both flags and the path.
void check_outputs_against_inputs(const CLI::App& command);

}  // namespace cubevec::cli
