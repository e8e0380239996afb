#include "base/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace cubevec {

namespace {

void check_mode(const std::string& path, const struct stat& info) {
  if (S_ISDIR(info.st_mode)) throw Error(path + ": is a directory, not a file");
  if (!S_ISREG(info.st_mode)) throw Error(path + ": is not a regular file (a FIFO, socket or device)");
}

}  // namespace

bool folder_exists(const std::string& path, const std::string& suffix) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return false;
  if (!S_ISDIR(info.st_mode)) throw Error(path + " is not a folder" + suffix);
  return true;
}

void require_regular_file(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    const int err = errno;
    throw Error(path + ": cannot open: " + std::strerror(err));
  }
  check_mode(path, info);
}

std::string read_regular_file(const std::string& path, std::size_t max_bytes) {
  require_regular_file(path);
  // O_NONBLOCK: should the path turn into a FIFO after the check, the open still returns.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot be read: " + std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw Error(path + ": is not a regular file (a FIFO, socket or device)");
  }
  if (static_cast<std::size_t>(info.st_size) > max_bytes) {
    ::close(fd);
    throw Error(path + ": is " + std::to_string(info.st_size) + " bytes, more than the " + std::to_string(max_bytes) +
                " a file of this kind may have");
  }
  std::string bytes(static_cast<std::size_t>(info.st_size), '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // a file that shrank while read: what is there
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  bytes.resize(done);
  return bytes;
}

}  // namespace cubevec
