#include "cli/command_line.h"

#include <cstdio>
#include <string>

#include "cli/error_line.h"
#include "cli/number_checks.h"
#include "cli/output_overlap.h"
#include "cli/tuning_file_flag.h"

namespace cubevec::cli {

CommandLine::CommandLine() {
  app_.require_subcommand(1);
  const auto add = [&](CommandRunner (*adder)(CLI::App&)) {
    const std::size_t before = app_.get_subcommands({}).size();
    CommandRunner runner = adder(app_);
    runners_[app_.get_subcommands({})[before]] = std::move(runner);
  };
  add(add_inspect_command);
  add(add_cv_experiment_command);
  add(add_attention_command);
  add(add_t2i_command);
  add(add_t2v_command);
  add(add_forward_command);
  add(add_encode_prompt_command);
  add(add_encode_image_command);
  add(add_tune_cache_command);
  add(add_quantize_command);
  add(add_sparse_attention_command);
  add(add_tune_command);
  add(add_serve_command);
  for (CLI::App* sub : app_.get_subcommands({})) tuning_files_[sub] = add_tuning_file_flag(*sub);
  add_number_checks(app_);
}

ParsedCommand CommandLine::parse(int argc, const char* const* argv) {
  // CLI11 would only say "a subcommand is required"; name the unknown word and the known ones.
  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* sub : app_.get_subcommands({})) {
      found = found || sub->get_name() == argv[1];
      known += (known.empty() ? "" : ", ") + sub->get_name();
    }
    if (!found) {
      std::fprintf(stderr, "error: unknown command '%s' (expected one of: %s)\n", one_line(argv[1]).c_str(), known.c_str());
      return {{}, 1};
    }
  }
  try {
    app_.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return {{}, app_.exit(e)};
  } catch (const CLI::CallForAllHelp& e) {
    return {{}, app_.exit(e)};
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see cubevec --help)\n", one_line(e.what()).c_str());
    return {{}, 1};
  }
  for (const auto& [subcommand, run] : runners_)
    if (subcommand->parsed()) {
      check_outputs_against_inputs(*subcommand);
      return {[run = run, tuning_file = tuning_files_.at(subcommand), writes_it = subcommand->get_name() == "tune"] {
                use_tuning_file(*tuning_file, writes_it);
                return run();
              },
              0};
    }
  std::fprintf(stderr, "error: no subcommand given (see cubevec --help)\n");
  return {{}, 1};
}

}  // namespace cubevec::cli
