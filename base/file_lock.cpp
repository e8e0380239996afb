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
#include <set>
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
  // Lock files this process has already warned about (unusable, or a holder that did not let go):
  // one warning each, and no second wait for a holder that outlasted the first.
  std::set<std::string> gone_around;
};
Registry& registry() {
  static auto* r = new Registry;  // never destroyed: a lock may be released during static destruction
  return *r;
}

void warn_once(Registry& r, const std::string& lock_path, const std::string& message) {
  if (r.gone_around.insert(lock_path).second) std::fprintf(stderr, "cubevec: warning: %s; going on without it\n", message.c_str());
}

// The lock file opened, or -1 (warned, unless the folder simply cannot hold a new file). Checked
// before it is opened (a planted device, socket or FIFO is never opened) and again after (it may
// have been swapped in between). Opened read-only: flock needs no write access, so a lock file
// another user created is still shared.
int open_lock_file(Registry& r, const std::string& lock_path) {
  struct stat st {};
  const bool exists = ::lstat(lock_path.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) {
    warn_once(r, lock_path,
              "the lock file " + lock_path + " is " + (S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file") +
                  " (cubevec does not follow or open it)");
    return -1;
  }
  const mode_t mask = ::umask(0);
  ::umask(mask);
  const int fd = ::open(lock_path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0666 & ~mask);
  if (fd < 0) {
    const int error = errno;
    const bool folder_refuses_new_file = !exists && (error == EACCES || error == EROFS || error == ENOENT || error == EPERM);
    if (!folder_refuses_new_file)
      warn_once(r, lock_path,
                "cannot use the lock file " + lock_path + " (" + (error == ELOOP ? "it is a symbolic link" : std::strerror(error)) + ")");
    return -1;
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    warn_once(r, lock_path, "the lock file " + lock_path + " is not a regular file");
    ::close(fd);
    return -1;
  }
  return fd;
}

// Takes the flock within `wait`, polling (flock itself cannot time out) so that a signal is seen.
// A holder that already outlasted one wait of this process gets none: one try.
bool lock_within(Registry& r, int fd, const std::string& lock_path, std::chrono::milliseconds wait) {
  if (r.gone_around.count(lock_path)) wait = std::chrono::milliseconds(0);
  const auto start = std::chrono::steady_clock::now();
  bool said_waiting = false;
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    if (errno != EWOULDBLOCK && errno != EINTR) {
      warn_once(r, lock_path, "cannot lock " + lock_path + " (" + std::strerror(errno) + ")");
      return false;
    }
    throw_if_interrupted();
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= wait) {
      if (wait.count() > 0) {
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%.1f", std::chrono::duration<double>(wait).count());
        warn_once(r, lock_path, "another process has held " + lock_path + " for " + seconds + " s (a stopped process?)");
      }
      return false;
    }
    if (!said_waiting && waited >= std::chrono::seconds(1)) {
      std::fprintf(stderr, "cubevec: waiting for %s: another cubevec process holds it (a calibration takes seconds)\n", lock_path.c_str());
      said_waiting = true;
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
    h.fd = open_lock_file(r, lock_path_);
    bool locked = false;
    try {
      locked = h.fd >= 0 && lock_within(r, h.fd, lock_path_, wait);
    } catch (...) {
      if (h.fd >= 0) ::close(h.fd);
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
