// Writing output files without ever destroying one: a file cubevec writes goes to an exclusively
// created temporary beside its target (a random name, O_EXCL, so no planted file or symlink is
// followed) and is renamed over the target only by commit(), after the whole result is written.
// A target that exists and is not a regular writable file (a symlink, FIFO, directory, device or
// read-only file) is refused, so is a directory that does not exist or cannot be written; commands
// call check_output_path on every output flag before any work starts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cubevec {

// What keeps `path` from becoming a regular file cubevec may replace ("is a symbolic link; ...",
// "the directory D does not exist", ...), or "" when nothing does.
std::string output_path_problem(const std::string& path);
// Throws "<what> <path>: <problem>" for output_path_problem; `what` names the input, e.g. "--out".
void check_output_path(const std::string& path, const std::string& what);

class OutputFile {
 public:
  // Checks the path and creates the temporary (permissions 0666 less the umask, as a new file).
  OutputFile(std::string path, std::string what);
  ~OutputFile();  // an uncommitted temporary is removed: the target keeps its old content
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Appends bytes; an I/O failure (a full disk) throws naming the target and the OS reason.
  void write(const void* data, std::size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  // Overwrites bytes already written at `offset` (headers patched at the end).
  void write_at(uint64_t offset, const void* data, std::size_t bytes);
  uint64_t size() const { return size_; }
  // Flushes and closes the temporary, keeping it for commit(): many finished files need not hold
  // a descriptor each.
  void close();
  // Flushes, closes (if still open) and renames the temporary over the target (checked again: still absent or a
  // regular file). After it, the object does nothing.
  void commit();
  // The same, renamed now even while an OutputBatch is open: for a file that is not one of the
  // run's outputs (a cache other processes read).
  void commit_now();
  // Drops the temporary now (what the destructor does).
  void discard() noexcept;

  // Committed here or, while an OutputBatch is open, handed to it (renamed by its commit_all()).
  const std::string& path() const { return path_; }
  const std::string& temporary_path() const { return temporary_; }
  bool committed() const { return committed_; }

 private:
  [[noreturn]] void fail(const std::string& action, int error);
  std::string path_, what_, temporary_;
  int fd_ = -1;
  uint64_t size_ = 0;
  bool committed_ = false;
};

// Removes every temporary not yet committed or discarded; async cleanup for a run that is being
// ended without unwinding (base/interrupt.h's watchdog). Safe to call from any thread.
void remove_live_temporaries() noexcept;

// The whole file at once: check, temporary, write, commit.
void write_output_file(const std::string& path, const std::string& what, std::string_view bytes);

// A run's outputs land together: while a batch is open (one per process), OutputFile::commit()
// hands its finished temporary to the batch instead of renaming it, and commit_all() renames them
// all at the end of a successful run, each target checked again first. A failure before that (a
// --trace that cannot be written after the picture was made) leaves every previous file as it was;
// the batch's destructor removes what it still holds.
class OutputBatch {
 public:
  OutputBatch();  // throws if another batch is open
  ~OutputBatch();
  OutputBatch(const OutputBatch&) = delete;
  OutputBatch& operator=(const OutputBatch&) = delete;
  void commit_all();

  struct Pending {
    std::string temporary, path, what;
  };
  void adopt(Pending pending);  // OutputFile::commit's hand-over
  static OutputBatch* open_batch();

 private:
  std::vector<Pending> pending_;
};

}  // namespace cubevec
