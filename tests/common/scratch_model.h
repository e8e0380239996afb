// A copy of a model folder under tests/data for one test to break (a config edited, a file
// removed), removed again when the test ends.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace cubevec::testing {

struct ScratchModel {
  std::filesystem::path dir;

  explicit ScratchModel(const std::string& folder) {
    const auto* test = ::testing::UnitTest::GetInstance();
    dir = std::filesystem::temp_directory_path() /
          ("cubevec_scratch_" + std::to_string(test->random_seed()) + "_" + test->current_test_info()->name());
    std::filesystem::remove_all(dir);
    std::filesystem::copy(std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + folder, dir, std::filesystem::copy_options::recursive);
  }
  ~ScratchModel() { std::filesystem::remove_all(dir); }
  ScratchModel(const ScratchModel&) = delete;
  ScratchModel& operator=(const ScratchModel&) = delete;

  std::string read(const std::string& rel) const {
    std::string text(std::filesystem::file_size(dir / rel), '\0');
    std::ifstream(dir / rel).read(text.data(), static_cast<std::streamsize>(text.size()));
    return text;
  }
  void write(const std::string& rel, const std::string& text) const { std::ofstream(dir / rel) << text; }
  // The first `from` in the file replaced by `to` (a test failure if there is none).
  void replace(const std::string& rel, const std::string& from, const std::string& to) const {
    std::string text = read(rel);
    const auto at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from << " in " << text;
    write(rel, text.replace(at, from.size(), to));
  }
};

}  // namespace cubevec::testing
