// Suite `memory`: weight streaming on a FLUX.1-dev-shaped transformer (bench/flux_dev_shaped.h,
// 24 GB of random bf16 weights) at 256x256 for one step, with --offload 0, 2 and 4. Each run is a
// child `cubevec t2i` (the README's command), whose --json reports its own peak resident set; the rows give that peak, the step time, and how much of the prefetch packing
// the compute hid. --offload 0 needs every weight resident and packed (about 48 GB): on a machine
// with less memory the estimate refuses it before loading, and the row says so.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench/flux_dev_shaped.h"
#include "bench/harness.h"

namespace cubevec::bench {

namespace {

namespace fs = std::filesystem;

struct ChildRun {
  int status = -1;
  std::string err;
};

// Runs `args` (argv[0] a path) with stderr to `err_path`; the child's exit status and peak RSS.
ChildRun run_child(const std::vector<std::string>& args, const std::string& err_path) {
  std::vector<std::string> text = args;
  std::vector<char*> argv;
  for (std::string& a : text) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err < 0 || ::dup2(err, 2) < 0) ::_exit(127);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ChildRun run;
  if (pid < 0) return run;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_path);
  std::stringstream all;
  all << in.rdbuf();
  run.err = all.str();
  return run;
}

}  // namespace

void memory_suite(Context& context) {
  const char* dir_env = std::getenv("CUBEVEC_FLUX_DEV_SHAPED_DIR");
  const std::string dir = dir_env && *dir_env ? dir_env : "/tmp/cubevec-flux-dev-shaped";
  const std::string embeds = ensure_flux_dev_shaped(dir);
  const std::string cubevec = (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "cubevec").string();
  const std::string scratch = (fs::temp_directory_path() / ("cubevec_memory_" + std::to_string(::getpid()))).string();
  fs::create_directories(scratch);
  for (int resident : {0, 2, 4}) {
    const std::string json = scratch + "/run.json";
    fs::remove(json);
    const std::vector<std::string> args = {cubevec,           "t2i",
                                           "--model",         dir,
                                           "--prompt-embeds", embeds,
                                           "--width",         "256",
                                           "--height",        "256",
                                           "--steps",         "1",
                                           "--dtype",         "bf16",
                                           "--offload",       std::to_string(resident),
                                           "--out",           scratch + "/out.jpg",
                                           "--json",          json};
    std::fprintf(stderr, "memory: cubevec t2i ... --offload %d\n", resident);
    const ChildRun run = run_child(args, scratch + "/stderr.txt");
    Result r{"memory", "flux-dev-shaped 256x256 1 step bf16", "offload " + std::to_string(resident)};
    r.dtype = "bf16";
    r.extra["exit_status"] = run.status;
    if (run.status != 0 || !fs::exists(json)) {
      const auto line = run.err.find("error: ");
      std::fprintf(stderr, "memory: --offload %d did not run: %s\n", resident,
                   line == std::string::npos ? "(no error line)" : run.err.substr(line, run.err.find('\n', line) - line).c_str());
      context.add(r);
      continue;
    }
    const nlohmann::json report = nlohmann::json::parse(std::ifstream(json));
    r.timing = summarize(report["step_s"].get<std::vector<double>>());
    r.extra["load_s"] = report["stages_s"].value("load", 0.0);
    r.extra["estimated_peak_gib"] = report["memory_estimate"]["peak_bytes"].get<double>() / (1 << 30);
    r.extra["allocator_peak_gib"] = report["peak_live_bytes"].get<double>() / (1 << 30);
    r.extra["peak_rss_gib"] = report["peak_resident_bytes"].get<double>() / (1 << 30);
    for (const auto& stage : report["stages"])
      if (stage["name"] == "offload") {
        const double pack = stage["settings"]["pack_seconds"], wait = stage["settings"]["wait_seconds"];
        r.extra["prefetch_pack_s"] = pack;
        r.extra["compute_waited_s"] = wait;
        r.extra["prefetch_hidden_pct"] = pack > 0 ? 100.0 * std::max(0.0, 1.0 - wait / pack) : 100.0;
      }
    context.add(r);
  }
  fs::remove_all(scratch);
}

}  // namespace cubevec::bench
