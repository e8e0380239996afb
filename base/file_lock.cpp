#include "base/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "base/interrupt.h"

namespace cubevec {

namespace {

// Every FileLock of the process: one thread at a time holds any of them (recursively), and each
// lock file's descriptor is opened once however deeply it is taken.
struct Held {
  int fd = -1;  // -1: taken without the flock (see the header)
  int depth = 0;
};
struct Registry {
  std::recursive_mutex mutex;
  std::map<std::string, Held> held;  // guarded by `mutex`
};
Registry& registry() {
  static auto* r = new Registry;  // never destroyed: a lock may be released during static destruction
  return *r;
}

// The lock file opened, or -1 (with a warning unless the folder simply cannot be written).
int open_lock_file(const std::string& lock_path) {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  // O_NOFOLLOW: a planted symlink is not followed; O_NONBLOCK: a planted FIFO does not wait for a writer.
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0666 & ~mask);
  if (fd < 0) {
    const int error = errno;
    if (error != EACCES && error != EROFS && error != ENOENT && error != EPERM)
      std::fprintf(stderr, "cubevec: warning: cannot use the lock file %s (%s); going on without it\n", lock_path.c_str(),
                   error == ELOOP ? "it is a symbolic link" : std::strerror(error));
    return -1;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    std::fprintf(stderr, "cubevec: warning: the lock file %s is not a regular file; going on without it\n", lock_path.c_str());
    ::close(fd);
    return -1;
  }
  return fd;
}

// Takes the flock within `wait`, polling (flock itself cannot time out) so that a signal is seen.
bool lock_within(int fd, const std::string& lock_path, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    if (errno != EWOULDBLOCK && errno != EINTR) {
      std::fprintf(stderr, "cubevec: warning: cannot lock %s (%s); going on without it\n", lock_path.c_str(), std::strerror(errno));
      return false;
    }
    throw_if_interrupted();
    if (std::chrono::steady_clock::now() >= deadline) {
      std::fprintf(stderr, "cubevec: warning: another process has held %s for %.1f s; going on without it\n", lock_path.c_str(),
                   std::chrono::duration<double>(wait).count());
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

FileLock::FileLock(const std::string& path, std::chrono::milliseconds wait) : lock_path_(lock_path(path)) {
  Registry& r = registry();
  r.mutex.lock();
  Held& h = r.held[lock_path_];
  if (h.depth == 0) {
    h.fd = open_lock_file(lock_path_);
    bool locked = false;
    try {
      locked = h.fd >= 0 && lock_within(h.fd, lock_path_, wait);
    } catch (...) {
      ::close(h.fd);
      r.held.erase(lock_path_);
      r.mutex.unlock();
      throw;
    }
    if (!locked && h.fd >= 0) {
      ::close(h.fd);
      h.fd = -1;
    }
  }
  ++h.depth;
  held_ = h.fd >= 0;
}

FileLock::~FileLock() {
  Registry& r = registry();
  Held& h = r.held[lock_path_];
  if (--h.depth == 0) {
    if (h.fd >= 0) ::close(h.fd);  // closing the only descriptor releases the flock
    r.held.erase(lock_path_);
  }
  r.mutex.unlock();
}

}  // namespace cubevec
