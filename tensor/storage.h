// Storage: the bytes behind one or more tensors. Either owned (from an Allocator, returned to it on
// destruction) or borrowed (e.g. a region of a memory-mapped file, kept alive by a shared owner).
#pragma once

#include <cstddef>
#include <memory>

#include "tensor/allocator.h"

namespace cubevec {

class Storage {
 public:
  // Owned bytes from `allocator` (which must outlive the storage).
  static std::shared_ptr<Storage> allocate(std::size_t nbytes, Allocator& allocator);
  // Borrowed bytes; `owner` keeps them valid. Read-only storages refuse mutable access.
  static std::shared_ptr<Storage> borrow(const void* data, std::size_t nbytes, std::shared_ptr<const void> owner,
                                         bool read_only);

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  const std::byte* data() const { return data_; }
  std::byte* mutable_data();  // throws cubevec::Error on read-only storage
  std::size_t nbytes() const { return nbytes_; }
  bool read_only() const { return read_only_; }

  // Guards reuse of the bytes by other streams once this storage dies (see Note [Stream-aware reuse]).
  void set_reuse_fence(std::shared_ptr<const ReuseFence> fence) { reuse_fence_ = std::move(fence); }

 private:
  Storage() = default;

  std::byte* data_ = nullptr;
  std::size_t nbytes_ = 0;
  bool read_only_ = false;
  Allocator* allocator_ = nullptr;  // set when owned
  std::shared_ptr<const void> owner_;  // set when borrowed
  std::shared_ptr<const ReuseFence> reuse_fence_;
};

}  // namespace cubevec
