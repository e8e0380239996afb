// How a subcommand plugs into the `cubevec` binary: it adds itself to the CLI11 app and returns
// the function that runs it once the command line has been parsed.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace cubevec::cli {

// Runs the parsed subcommand; returns the process exit status. User errors throw cubevec::Error.
using CommandRunner = std::function<int()>;

CommandRunner add_inspect_command(CLI::App& app);
CommandRunner add_cv_experiment_command(CLI::App& app);
CommandRunner add_attention_command(CLI::App& app);
CommandRunner add_t2i_command(CLI::App& app);
CommandRunner add_t2v_command(CLI::App& app);
CommandRunner add_forward_command(CLI::App& app);
CommandRunner add_encode_prompt_command(CLI::App& app);
CommandRunner add_encode_image_command(CLI::App& app);
CommandRunner add_tune_cache_command(CLI::App& app);
CommandRunner add_quantize_command(CLI::App& app);
CommandRunner add_sparse_attention_command(CLI::App& app);
CommandRunner add_tune_command(CLI::App& app);
CommandRunner add_serve_command(CLI::App& app);

}  // namespace cubevec::cli
