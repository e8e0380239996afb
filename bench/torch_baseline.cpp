#include "bench/torch_baseline.h"

#include <cstdio>

namespace cubevec::bench {

nlohmann::json run_torch(const std::string& script_name, int threads, int repeats, const std::string& extra_args) {
  const std::string script = std::string(CUBEVEC_SOURCE_DIR) + "/bench/" + script_name;
  const std::string command = "/usr/bin/python3 " + script + " --threads " + std::to_string(threads) + " --repeats " +
                              std::to_string(repeats) + (extra_args.empty() ? "" : " " + extra_args) + " 2>/dev/null";
  std::fprintf(stderr, "running the PyTorch baseline: %s\n", command.c_str());
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return nullptr;
  std::string out;
  char buffer[4096];
  while (std::size_t n = fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  if (pclose(pipe) != 0 || out.empty()) return nullptr;
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception&) {
    return nullptr;
  }
}

}  // namespace cubevec::bench
