// OutputFile: outputs appear only on commit, never through a symlink or over a special file, and
// an abandoned or failed write leaves the old file byte for byte with no temporary beside it.
#include "base/output_file.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"

namespace output_file_test {  // named after the file: unity batches never mix two files' helpers

namespace fs = std::filesystem;

class OutputFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "cubevec_out_XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string read(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static void write_plain(const std::string& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }
  int entries() const { return static_cast<int>(std::distance(fs::directory_iterator(dir_), fs::directory_iterator())); }
  static std::string message_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const cubevec::Error& e) {
      return e.what();
    }
    return "(no error)";
  }
  fs::path dir_;
};

TEST_F(OutputFileTest, TheTargetChangesOnlyOnCommit) {
  const std::string p = path("a.bin");
  write_plain(p, "old");
  {
    cubevec::OutputFile out(p, "--out");
    out.write("new content");
    out.write_at(0, "N", 1);
    EXPECT_EQ(read(p), "old") << "not yet committed";
    EXPECT_EQ(entries(), 2) << "the temporary sits beside the target";
    EXPECT_EQ(fs::path(out.temporary_path()).parent_path(), dir_);
    out.commit();
  }
  EXPECT_EQ(read(p), "New content");
  EXPECT_EQ(entries(), 1);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  struct stat st {};
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666 & ~mask) << "permissions of a newly created file, not mkstemp's 0600";
}

TEST_F(OutputFileTest, AnAbandonedOrFailedWriteLeavesTheOldFileAndNoTemporary) {
  const std::string p = path("keep.json");
  write_plain(p, "precious");
  {
    cubevec::OutputFile out(p, "--json");
    out.write("half");
  }  // an exception or Ctrl-C unwinding through here
  EXPECT_EQ(read(p), "precious");
  EXPECT_EQ(entries(), 1);
  cubevec::OutputFile out(p, "--json");
  out.discard();
  EXPECT_NE(message_of([&] { out.write("x"); }).find("--json " + p + ": write after the file was closed or discarded"), std::string::npos);
  EXPECT_EQ(entries(), 1);
}

TEST_F(OutputFileTest, ABatchLandsAllOutputsTogetherOrNone) {
  write_plain(path("picture.jpg"), "old picture");
  write_plain(path("report.json"), "old report");
  {
    // A run that fails after the picture was written (its --json cannot be made): nothing changes.
    cubevec::OutputBatch batch;
    cubevec::write_output_file(path("picture.jpg"), "JPEG output", "new picture");
    EXPECT_EQ(read(path("picture.jpg")), "old picture") << "held by the batch";
    EXPECT_EQ(entries(), 3) << "the picture's temporary waits beside it";
  }
  EXPECT_EQ(read(path("picture.jpg")), "old picture");
  EXPECT_EQ(entries(), 2) << "the batch removed the temporary";
  {
    cubevec::OutputBatch batch;
    EXPECT_NE(message_of([] { cubevec::OutputBatch second; }).find("already open"), std::string::npos);
    cubevec::write_output_file(path("picture.jpg"), "JPEG output", "new picture");
    cubevec::write_output_file(path("report.json"), "--json", "new report");
    EXPECT_EQ(read(path("report.json")), "old report");
    batch.commit_all();
    EXPECT_EQ(read(path("picture.jpg")), "new picture");
    EXPECT_EQ(read(path("report.json")), "new report");
    // After commit_all, commits are immediate again (a cache saved after the run).
    cubevec::write_output_file(path("cache.json"), "cache", "cached");
    EXPECT_EQ(read(path("cache.json")), "cached");
  }
  EXPECT_EQ(entries(), 3);
}

TEST_F(OutputFileTest, SpecialTargetsAreRefusedAndLeftAlone) {
  write_plain(path("target"), "target bytes");
  fs::create_symlink(path("target"), path("link"));
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  fs::create_directory(path("dir"));
  write_plain(path("ro"), "read-only bytes");
  fs::permissions(path("ro"), fs::perms::owner_read);
  const struct {
    std::string name, problem;
  } cases[] = {
      {"link", "is a symbolic link; cubevec replaces only regular files (remove the link or choose another path)"},
      {"fifo", "is not a regular file (a FIFO, socket or device)"},
      {"dir", "is a directory, not a file"},
      {"ro", "is read-only; cubevec will not replace it"},
      {"missing/x.jpg", "the directory " + path("missing") + " does not exist"},
      {"target/x.jpg", path("target") + " is not a directory"},
  };
  for (const auto& c : cases) {
    const std::string message = message_of([&] { cubevec::OutputFile out(path(c.name), "--out"); });
    EXPECT_EQ(message, "--out " + path(c.name) + ": " + c.problem) << c.name;
    EXPECT_EQ(cubevec::output_path_problem(path(c.name)), c.problem);
  }
  EXPECT_EQ(read(path("target")), "target bytes");
  EXPECT_TRUE(fs::is_symlink(path("link")));
  EXPECT_TRUE(fs::is_fifo(path("fifo")));
  EXPECT_EQ(read(path("ro")), "read-only bytes");
  EXPECT_EQ(entries(), 5) << "no temporary was created";
  EXPECT_EQ(cubevec::output_path_problem(""), "the output path is empty");
  EXPECT_EQ(cubevec::output_path_problem(path("new.jpg")), "");
}

// A name that fits the file system only without the temporary's 16 extra bytes is refused up front,
// not after the work at the first write.
TEST_F(OutputFileTest, ANameTooLongForItsTemporaryIsRefusedUpFront) {
  const long name_max = ::pathconf(dir_.c_str(), _PC_NAME_MAX);
  ASSERT_GT(name_max, 16);
  const std::string longest(static_cast<std::size_t>(name_max - 16), 'a'), too_long(static_cast<std::size_t>(name_max - 10), 'b');
  EXPECT_EQ(cubevec::output_path_problem(path(longest)), "");
  {
    cubevec::OutputFile out(path(longest), "--out");
    out.write("fits");
    out.commit();
  }
  EXPECT_EQ(read(path(longest)), "fits");
  const std::string message = message_of([&] { cubevec::OutputFile out(path(too_long), "--out"); });
  EXPECT_NE(message.find("the file name is " + std::to_string(too_long.size()) +
                         " bytes long; cubevec writes through a temporary file beside it, so at most " + std::to_string(longest.size()) +
                         " bytes fit"),
            std::string::npos)
      << message;
  EXPECT_EQ(entries(), 1) << "nothing written for the refused name";
}

TEST_F(OutputFileTest, PlantedTemporaryNamesAreNeverFollowed) {
  // Earlier versions wrote to "<target>.tmp": a link planted there pointed the write elsewhere.
  write_plain(path("victim"), "victim bytes");
  fs::create_symlink(path("victim"), path("out.jpg.tmp"));
  cubevec::write_output_file(path("out.jpg"), "--out", "picture");
  EXPECT_EQ(read(path("out.jpg")), "picture");
  EXPECT_EQ(read(path("victim")), "victim bytes");
  EXPECT_TRUE(fs::is_symlink(path("out.jpg.tmp")));
}

TEST_F(OutputFileTest, ATargetThatBecameALinkDuringTheRunIsNotReplaced) {
  write_plain(path("victim"), "victim bytes");
  cubevec::OutputFile out(path("out.avi"), "--out");
  out.write("video");
  fs::create_symlink(path("victim"), path("out.avi"));
  EXPECT_NE(message_of([&] { out.commit(); }).find("is a symbolic link"), std::string::npos);
  EXPECT_TRUE(fs::is_symlink(path("out.avi")));
  EXPECT_EQ(read(path("victim")), "victim bytes");
  EXPECT_EQ(entries(), 2);
}

TEST_F(OutputFileTest, ClosedFilesWaitForTheirCommit) {
  std::vector<std::unique_ptr<cubevec::OutputFile>> frames;
  for (int i = 0; i < 3; ++i) {
    frames.push_back(std::make_unique<cubevec::OutputFile>(path("f" + std::to_string(i)), "--frames-dir"));
    frames.back()->write("frame " + std::to_string(i));
    frames.back()->close();
  }
  EXPECT_FALSE(fs::exists(path("f0")));
  for (auto& f : frames) f->commit();
  EXPECT_EQ(read(path("f2")), "frame 2");
  EXPECT_EQ(entries(), 3);
}

}  // namespace output_file_test
