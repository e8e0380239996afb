// Small input files are read only when they are regular files, checked before anything opens
// them: a FIFO (whose open would block until a writer comes), a directory, /dev/zero (endless),
// a symlink loop and a file over its size limit are one-line errors naming the path; a symlink
// to a regular file is followed. The JSON reader and the safetensors loader go through the check.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/regular_file.h"
#include "tensor/safetensors.h"
#include "base/strict_json.h"

#include "common/temp_dir.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace regular_file_test {  // named after the file: unity batches never mix two files' helpers

using testing::message_of;

TEST(RegularFile, OnlyRegularFilesAreRead) {
  testing::TempDir dir;
  const std::string file = dir.write("a.json", R"({"x": 1})");
  const std::string fifo = (dir.path / "fifo.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string link = (dir.path / "link.json").string(), loop = (dir.path / "loop.json").string();
  std::filesystem::create_symlink(file, link);
  std::filesystem::create_symlink(loop, loop);

  EXPECT_EQ(read_regular_file(file), R"({"x": 1})");
  EXPECT_EQ(read_regular_file(link), R"({"x": 1})");
  EXPECT_NE(message_of([&] { read_regular_file(fifo); }).find("fifo.json: is not a regular file (a FIFO, socket or device)"),
            std::string::npos);
  EXPECT_NE(message_of([&] { read_regular_file("/dev/zero"); }).find("/dev/zero: is not a regular file"), std::string::npos);
  EXPECT_NE(message_of([&] { read_regular_file(dir.path.string()); }).find(": is a directory, not a file"), std::string::npos);
  EXPECT_NE(message_of([&] { read_regular_file(loop); }).find("loop.json: cannot open: Too many levels of symbolic links"),
            std::string::npos);
  EXPECT_NE(message_of([&] { read_regular_file((dir.path / "none.json").string()); }).find("none.json: cannot open: No such file"),
            std::string::npos);
  EXPECT_NE(message_of([&] { read_regular_file(file, 4); }).find("a.json: is 8 bytes, more than the 4 a file of this kind may have"),
            std::string::npos);
  // Through the readers that use it.
  EXPECT_NE(message_of([&] { read_json_file(fifo, 4); }).find("is not a regular file"), std::string::npos);
  EXPECT_NE(message_of([&] { SafetensorsFile::open(fifo); }).find("is not a regular file"), std::string::npos);
  EXPECT_NE(message_of([&] { SafetensorsFile::open("/dev/zero"); }).find("is not a regular file"), std::string::npos);
  // One prefix for a syntax error, not two.
  const std::string bad = dir.write("bad.json", "{");
  const std::string msg = message_of([&] { read_json_file(bad, 4); });
  EXPECT_NE(msg.find("bad.json: not valid JSON: "), std::string::npos) << msg;
  EXPECT_EQ(msg.find("not valid JSON: not valid JSON"), std::string::npos) << msg;
}

}  // namespace regular_file_test
}  // namespace cubevec
