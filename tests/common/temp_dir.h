// A fresh directory under the system temp dir, removed with everything in it at scope exit.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace cubevec::testing {

struct TempDir {
  std::filesystem::path path;

  explicit TempDir(const std::string& prefix = "cubevec_test") {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Writes `text` to path/name and returns the file's path.
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
    return (path / name).string();
  }
};

}  // namespace cubevec::testing
