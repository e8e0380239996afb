#include "tensor/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/regular_file.h"

namespace cubevec {

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  require_regular_file(path);  // before the open, which blocks on a FIFO
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<std::size_t>(info.st_size);
  if (file->size_ > 0) {  // mmap of length 0 is an error; an empty file simply has no bytes
    void* data = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw Error(path + ": cannot memory-map " + std::to_string(file->size_) + " bytes: " + std::strerror(err));
    }
    file->data_ = static_cast<const std::byte*>(data);
  }
  ::close(fd);  // the mapping stays valid after close
  return file;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace cubevec
