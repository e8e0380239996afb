// A lock held across processes on a file several of them update by read-modify-write (the tuning
// file): an advisory flock on "<path>.lock" beside it. The target itself cannot carry the lock: it
// is replaced by renaming a temporary over it, and a lock on the old inode guards nothing.
//
// Within a process the lock is reentrant (a thread that holds it may take it again, sharing the one
// descriptor: a second flock from the same process on a new descriptor would wait for itself) and
// threads take turns. A lock that cannot be had is not an error: a folder that cannot hold a new
// file (the file cannot be written there either), something not a regular file at the lock's path (a
// symlink, FIFO, socket or device: warned, never followed or opened), or a holder that does not let
// go within `wait` (warned: a stopped process; later locks of this process then try once and do not
// wait again) all leave the caller to go on unlocked, as it did before there was a lock. Each lock
// file is warned about once per process; a wait past a second says what it waits for. A signal
// (Ctrl-C) while waiting throws Interrupted.
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
