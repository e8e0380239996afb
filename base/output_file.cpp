#include "base/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <vector>

#include "base/error.h"

namespace cubevec {

namespace {

// The temporary beside a target: "." + its name + ".cubevec-XXXXXX".
constexpr std::size_t kTemporaryExtra = 16;

std::string directory_of(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

// What is wrong with an existing non-directory entry at `path` as an output, or "" when nothing.
std::string existing_target_problem(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return "";  // absent; the directory check says why
    return std::string("cannot be checked: ") + std::strerror(errno);
  }
  if (S_ISLNK(st.st_mode)) return "is a symbolic link; cubevec replaces only regular files (remove the link or choose another path)";
  if (S_ISDIR(st.st_mode)) return "is a directory, not a file";
  if (!S_ISREG(st.st_mode)) return "is not a regular file (a FIFO, socket or device)";
  // Mode bits, not access(): root may write anything, but a read-only file says "keep me".
  if ((st.st_mode & (S_IWUSR | S_IWGRP | S_IWOTH)) == 0) return "is read-only; cubevec will not replace it";
  return "";
}

// The temporaries that exist now. Never destroyed: a watchdog thread may use it while the
// process exits.
struct LiveTemporaries {
  std::mutex mutex;
  std::set<std::string> paths;
};
LiveTemporaries& live() {
  static auto* registry = new LiveTemporaries;
  return *registry;
}

mode_t new_file_mode() {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return static_cast<mode_t>(0666 & ~mask);
}

// Renames a finished temporary over its target, the target checked again first (something may
// have appeared there during the run: the same rules as up front), and drops it from the registry.
// Throws naming the target; the temporary is then the caller's to remove.
void move_into_place(const std::string& temporary, const std::string& path, const std::string& what) {
  const std::string problem = existing_target_problem(path);
  if (!problem.empty()) throw Error(what + " " + path + ": " + problem + " (it appeared during the run; nothing was written)");
  if (::rename(temporary.c_str(), path.c_str()) != 0)
    throw Error(what + " " + path + ": cannot move the finished file into place: " + std::strerror(errno) + " (the file was not changed)");
  std::lock_guard lock(live().mutex);
  live().paths.erase(temporary);
}

}  // namespace

std::string output_path_problem(const std::string& path) {
  if (path.empty()) return "the output path is empty";
  if (path.back() == '/') return "names a directory; give a file name";
  const std::string problem = existing_target_problem(path);
  if (!problem.empty()) return problem;
  const std::string dir = directory_of(path);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    return "the directory " + dir + " " + (errno == ENOENT ? "does not exist" : std::string("cannot be used: ") + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return "cannot write in the directory " + dir + ": " + std::strerror(errno);
  // The temporary's name is the target's plus kTemporaryExtra bytes: a name that fits only without
  // them would fail after the work, at the first write.
  const std::size_t name_bytes = std::filesystem::path(path).filename().string().size();
  long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  if (name_max <= 0) name_max = 255;
  if (name_bytes + kTemporaryExtra > static_cast<std::size_t>(name_max))
    return "the file name is " + std::to_string(name_bytes) +
           " bytes long; cubevec writes through a temporary file beside it, so at most " +
           std::to_string(static_cast<std::size_t>(name_max) - kTemporaryExtra) + " bytes fit in " + dir;
  return "";
}

void check_output_path(const std::string& path, const std::string& what) {
  const std::string problem = output_path_problem(path);
  if (!problem.empty()) throw Error(what + (path.empty() ? "" : " " + path) + ": " + problem);
}

OutputFile::OutputFile(std::string path, std::string what) : path_(std::move(path)), what_(std::move(what)) {
  check_output_path(path_, what_);
  const std::filesystem::path target(path_);
  std::string pattern = (std::filesystem::path(directory_of(path_)) / ("." + target.filename().string() + ".cubevec-XXXXXX")).string();
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  fd_ = ::mkostemp(name.data(), O_CLOEXEC);  // O_CREAT | O_EXCL: never an existing file or link
  if (fd_ < 0) throw Error(what_ + " " + path_ + ": cannot create a temporary file beside it: " + std::strerror(errno));
  temporary_ = name.data();
  {
    std::lock_guard lock(live().mutex);
    live().paths.insert(temporary_);
  }
  if (::fchmod(fd_, new_file_mode()) != 0) {
    const int error = errno;
    discard();
    throw Error(what_ + " " + path_ + ": cannot set the permissions of " + temporary_ + ": " + std::strerror(error));
  }
}

OutputFile::~OutputFile() { discard(); }

void OutputFile::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);  // a failed close of a file being dropped changes nothing
  fd_ = -1;
  if (!temporary_.empty()) {
    if (!committed_) ::unlink(temporary_.c_str());
    std::lock_guard lock(live().mutex);
    live().paths.erase(temporary_);
  }
  temporary_.clear();
}

void OutputFile::fail(const std::string& action, int error) {
  discard();
  throw Error(what_ + " " + path_ + ": " + action + ": " + std::strerror(error) + " (the file was not changed)");
}

void OutputFile::write(const void* data, std::size_t bytes) { write_at(size_, data, bytes); }

void OutputFile::write_at(uint64_t offset, const void* data, std::size_t bytes) {
  if (fd_ < 0) throw Error(what_ + " " + path_ + ": write after the file was " + (committed_ ? "committed" : "closed or discarded"));
  const char* p = static_cast<const char*>(data);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pwrite(fd_, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write", errno);
    }
    done += static_cast<std::size_t>(n);
  }
  size_ = std::max<uint64_t>(size_, offset + bytes);
}

void OutputFile::close() {
  if (fd_ < 0) {
    if (committed_ || temporary_.empty())
      throw Error(what_ + " " + path_ + ": close after the file was " + (committed_ ? "committed" : "discarded"));
    return;
  }
  if (::fsync(fd_) != 0 && errno != EINVAL) fail("cannot write", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot close", errno);
}

void OutputFile::commit() {
  if (OutputBatch* batch = OutputBatch::open_batch()) {  // renamed with the run's other outputs
    close();
    batch->adopt({temporary_, path_, what_});
    committed_ = true;
    temporary_.clear();
    return;
  }
  commit_now();
}

void OutputFile::commit_now() {
  close();
  try {
    move_into_place(temporary_, path_, what_);
  } catch (...) {
    discard();
    throw;
  }
  committed_ = true;
  temporary_.clear();
}

namespace {
std::atomic<OutputBatch*> open_output_batch{nullptr};
}  // namespace

OutputBatch::OutputBatch() {
  OutputBatch* expected = nullptr;
  if (!open_output_batch.compare_exchange_strong(expected, this)) throw Error("internal: an output batch is already open");
}

OutputBatch::~OutputBatch() {
  open_output_batch.store(nullptr);
  std::lock_guard lock(live().mutex);
  for (const Pending& p : pending_)
    if (!p.temporary.empty()) {
      ::unlink(p.temporary.c_str());
      live().paths.erase(p.temporary);
    }
}

OutputBatch* OutputBatch::open_batch() { return open_output_batch.load(); }

void OutputBatch::adopt(Pending pending) { pending_.push_back(std::move(pending)); }

void OutputBatch::commit_all() {
  open_output_batch.store(nullptr);  // later commits (a cache saved after the run) are immediate
  // Every target is checked before any is replaced, so a problem found now changes nothing.
  for (const Pending& p : pending_) {
    const std::string problem = existing_target_problem(p.path);
    if (!problem.empty()) throw Error(p.what + " " + p.path + ": " + problem + " (it appeared during the run; nothing was written)");
  }
  for (Pending& p : pending_) {
    move_into_place(p.temporary, p.path, p.what);
    p.temporary.clear();  // placed: nothing for the destructor to remove
  }
  pending_.clear();
}

void remove_live_temporaries() noexcept {
  std::lock_guard lock(live().mutex);
  for (const std::string& path : live().paths) ::unlink(path.c_str());
  live().paths.clear();
}

void write_output_file(const std::string& path, const std::string& what, std::string_view bytes) {
  OutputFile out(path, what);
  out.write(bytes);
  out.commit();
}

}  // namespace cubevec
