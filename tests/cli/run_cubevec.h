// Runs the built `cubevec` binary as a child process with stdout and stderr captured separately,
// in a scratch directory that each test gets fresh.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "media/png.h"

namespace cubevec_cli_test {

namespace fs = std::filesystem;

// The model folders the CLI tests run: the shipped tiny models and the random-weight checkpoints.
inline const std::string kTinyFlux = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";
inline const std::string kTinyWan = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinywan";
inline const std::string kFlux = std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/flux_tiny";
inline const std::string kWan = std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/wan_tiny";
inline const fs::path kData = fs::path(CUBEVEC_SOURCE_DIR) / "tests" / "data";
// The tiny two-expert model (Wan2.2 A14B's layout) at its test size: 4 steps, 2 per expert.
inline const std::vector<std::string> kTinyA14bRun = {"t2v",
                                                      "--model",
                                                      (kData / "wan22_tiny_a14b").string(),
                                                      "--prompt",
                                                      "a red circle moving right",
                                                      "--frames",
                                                      "9",
                                                      "--width",
                                                      "48",
                                                      "--height",
                                                      "32",
                                                      "--steps",
                                                      "4",
                                                      "--seed",
                                                      "5"};

// DIR/frame_00000.png ... of `count` frames (what --frames-dir writes).
inline std::vector<cubevec::media::RgbImage> read_frames(const std::string& dir, int count) {
  std::vector<cubevec::media::RgbImage> frames;
  for (int i = 0; i < count; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "/frame_%05d.png", i);
    frames.push_back(cubevec::media::read_png(dir + name));
  }
  return frames;
}

inline void write_text(const fs::path& path, const std::string& text) { std::ofstream(path, std::ios::binary | std::ios::trunc) << text; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Process {
  int status = -1;  // exit status, or -1 if the process did not exit normally
  std::string out, err;
};

// Runs the program argv_text[0] (a path) with the rest as arguments, stdout and stderr captured
// into separate files.
inline Process run_program(std::vector<std::string> argv_text, const fs::path& scratch) {
  const std::string out_path = (scratch / "stdout.txt").string(), err_path = (scratch / "stderr.txt").string();
  std::vector<char*> argv;
  for (std::string& arg : argv_text) argv.push_back(arg.data());
  argv.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return {};
  }
  if (pid == 0) {  // child: only async-signal-safe calls until exec
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0) ::_exit(127);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  Process run;
  run.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  run.out = read_file(out_path);
  run.err = read_file(err_path);
  return run;
}

// mpirun and its flags for a test: oversubscribed (more ranks than cores), LeakSanitizer off in the
// ranks (Open MPI keeps allocations until exit), and its session directory in the test's scratch
// folder: mpiruns sharing /tmp/ompi.<host>.<uid> race (one removes it as another starts, which then
// fails with "File exists").
inline std::vector<std::string> mpirun_command(const fs::path& scratch) {
  return {CUBEVEC_MPIRUN, "--allow-run-as-root",        "--oversubscribe", "--mca", "orte_tmpdir_base", scratch.string(),
          "-x",           "ASAN_OPTIONS=detect_leaks=0"};
}

// Runs the cubevec binary with `args`.
inline Process run_cubevec(const std::vector<std::string>& args, const fs::path& scratch) {
  std::vector<std::string> argv_text = {CUBEVEC_BINARY};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  return run_program(std::move(argv_text), scratch);
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "cubevec_cli_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << "mkdtemp " << pattern << ": " << std::strerror(errno);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  Process run(const std::vector<std::string>& args) const { return run_cubevec(args, dir_); }

  fs::path dir_;
};

}  // namespace cubevec_cli_test
