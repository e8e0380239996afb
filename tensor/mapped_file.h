// A whole file mapped read-only into memory (mmap), unmapped when the last owner lets go.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

namespace cubevec {

class MappedFile {
 public:
  // Throws cubevec::Error naming the path and the system's reason when the file cannot be mapped.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace cubevec
