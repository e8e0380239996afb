#include "cli/tuning_file_flag.h"

#include <cstdio>

#include "ops/gemm/tuner.h"
#include "tensor/output_file.h"

namespace cubevec::cli {

std::shared_ptr<std::string> add_tuning_file_flag(CLI::App& command) {
  auto path = std::make_shared<std::string>();
  command
      .add_option("--tune-cache", *path,
                  "Tuning file to read and update: the GEMM calibration and the attention picks (default: "
                  "$XDG_CACHE_HOME/cubevec/tuning.json, else ~/.cache/cubevec/tuning.json)")
      ->check(CLI::Validator([](const std::string& value) { return value.empty() ? std::string("expected a file path, got an empty string") : std::string(); },
                             "PATH"));
  return path;
}

void use_tuning_file(const std::string& path) {
  if (path.empty()) return;
  check_output_path(path, "--tune-cache");
  const std::string warning = ops::gemm::GemmTuner::global().set_file(path, true);
  if (!warning.empty()) std::fprintf(stderr, "warning: %s\n", warning.c_str());
}

}  // namespace cubevec::cli
