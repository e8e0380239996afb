// The `cubevec` command line: subcommands, and one place that turns every failure into
// "error: ..." on stderr with exit status 1 (user error) or 2 (internal error).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <exception>
#include <map>
#include <new>
#include <string>

#include "cli/command.h"
#include "cli/number_checks.h"
#include "cli/output_overlap.h"
#include "tensor/error.h"
#include "tensor/interrupt.h"

namespace {

// The contract is one error line: line breaks become "; ", and control characters from files
// (tensor names, config keys, prompt words) are shown as \xNN instead of reaching the terminal.
std::string one_line(const std::string& message) {
  std::string out;
  for (std::size_t i = 0; i < message.size(); ++i) {
    const auto c = static_cast<unsigned char>(message[i]);
    if (c == '\n') {
      out += "; ";
      while (i + 1 < message.size() && message[i + 1] == ' ') ++i;  // the indentation of a listed item
    } else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  cubevec::install_interrupt_handlers();
  CLI::App app{"cubevec: a PyTorch-free engine for diffusion transformers on an emulated Ascend device"};
  app.require_subcommand(1);
  std::map<CLI::App*, cubevec::cli::CommandRunner> runners;
  const auto add = [&](cubevec::cli::CommandRunner (*adder)(CLI::App&)) {
    const std::size_t before = app.get_subcommands({}).size();
    cubevec::cli::CommandRunner runner = adder(app);
    runners[app.get_subcommands({})[before]] = std::move(runner);
  };
  add(cubevec::cli::add_inspect_command);
  add(cubevec::cli::add_cv_experiment_command);
  add(cubevec::cli::add_attention_command);
  add(cubevec::cli::add_t2i_command);
  add(cubevec::cli::add_t2v_command);
  add(cubevec::cli::add_forward_command);
  add(cubevec::cli::add_tune_cache_command);
  add(cubevec::cli::add_quantize_command);
  add(cubevec::cli::add_sparse_attention_command);
  cubevec::cli::add_number_checks(app);

  // CLI11 would only say "a subcommand is required"; name the unknown word and the known ones.
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      found = found || sub->get_name() == argv[1];
      known += (known.empty() ? "" : ", ") + sub->get_name();
    }
    if (!found) {
      std::fprintf(stderr, "error: unknown command '%s' (expected one of: %s)\n", argv[1], known.c_str());
      return 1;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see cubevec --help)\n", e.what());
    return 1;
  }
  try {
    for (const auto& [subcommand, run] : runners)
      if (subcommand->parsed()) {
        cubevec::cli::check_outputs_against_inputs(*subcommand);
        return run();
      }
    std::fprintf(stderr, "error: no subcommand given (see cubevec --help)\n");
    return 1;
  } catch (const cubevec::Interrupted& e) {
    std::fprintf(stderr, "error: %s\n", one_line(e.what()).c_str());
    return e.exit_status();
  } catch (const cubevec::Error& e) {
    std::fprintf(stderr, "error: %s\n", one_line(e.what()).c_str());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the user gave could not be examined (a symlink loop, no permission): the OS's reason
    // and the path, as every other input error.
    std::fprintf(stderr, "error: %s: %s\n", one_line(e.path1().string()).c_str(), one_line(e.code().message()).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory: the request needs more memory than this machine gives (use a smaller size, fewer "
                         "frames or --simulate with smaller settings)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: internal error: %s\n", one_line(e.what()).c_str());
    return 2;
  }
}
