#include "cli/tuning_file_flag.h"

#include <cstdio>
#include <sys/stat.h>

#include "ops/gemm/tuner.h"
#include "base/error.h"
#include "base/output_file.h"

namespace cubevec::cli {

std::shared_ptr<std::string> add_tuning_file_flag(CLI::App& command) {
  auto path = std::make_shared<std::string>();
  command
      .add_option("--tune-cache", *path,
                  "Tuning file to read and update: the GEMM calibration and the attention picks (default: "
                  "$XDG_CACHE_HOME/cubevec/tuning.json, else ~/.cache/cubevec/tuning.json)")
      ->check(CLI::Validator(
          [](const std::string& value) { return value.empty() ? std::string("expected a file path, got an empty string") : std::string(); },
          "PATH"));
  return path;
}

void use_tuning_file(const std::string& path, bool command_writes_it) {
  if (command_writes_it && ops::gemm::amx_model_on())
    throw Error("tune: CUBEVEC_AMX_MODEL=1 is set: a run on the AMX tile model saves nothing to the tuning file (unset it to tune)");
  if (path.empty()) return;
  // A read-only tuning file is one to use and not to change: a run that finds what it needs there
  // goes ahead, and what it measures anew is not saved (a warning says so when it happens).
  struct stat st {};
  const bool read_only = ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) == 0;
  if (read_only && command_writes_it) check_output_path(path, "tuning file");  // the refusal, before any note
  if (!read_only) check_output_path(path, "--tune-cache");
  const std::string warning = ops::gemm::GemmTuner::global().set_file(path, true);
  if (!warning.empty()) std::fprintf(stderr, "warning: %s\n", warning.c_str());
  if (read_only)
    std::fprintf(stderr, "note: --tune-cache %s is read-only: its entries are used, and nothing measured in this run is saved\n",
                 path.c_str());
}

}  // namespace cubevec::cli
