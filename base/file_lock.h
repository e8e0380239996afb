// A lock held across processes on a file several of them update by read-modify-write (the tuning
// file): an advisory flock on "<path>.lock" beside it. The target itself cannot carry the lock: it
// is replaced by renaming a temporary over it, and a lock on the old inode guards nothing.
//
// Within a process the lock is reentrant (a thread that holds it may take it again, sharing the one
// descriptor: a second flock from the same process on a new descriptor would wait for itself) and
// threads take turns. A lock that cannot be had is not an error: a read-only folder (the file
// cannot be written either), a symlink or FIFO planted at the lock's path (warned, not followed, not
// opened for long), or a holder that does not let go within `wait` (warned: a stopped process) all
// leave the caller to go on unlocked, as it did before there was a lock. A signal (Ctrl-C) while
// waiting throws Interrupted.
#pragma once

#include <chrono>
#include <string>

namespace cubevec {

class FileLock {
 public:
  FileLock(const std::string& path, std::chrono::milliseconds wait);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

  // Whether this process holds the lock file's flock (false when it went on unlocked).
  bool held() const { return held_; }
  static std::string lock_path(const std::string& path) { return path + ".lock"; }

 private:
  std::string lock_path_;
  bool held_ = false;
};

}  // namespace cubevec
