#include "tensor/storage.h"

#include "tensor/error.h"

namespace cubevec {

std::shared_ptr<Storage> Storage::allocate(std::size_t nbytes, Allocator& allocator) {
  std::shared_ptr<Storage> storage(new Storage());
  storage->data_ = static_cast<std::byte*>(allocator.allocate(nbytes));
  storage->nbytes_ = nbytes;
  storage->allocator_ = &allocator;
  return storage;
}

std::shared_ptr<Storage> Storage::borrow(const void* data, std::size_t nbytes, std::shared_ptr<const void> owner,
                                         bool read_only) {
  std::shared_ptr<Storage> storage(new Storage());
  // const_cast is confined here: writable borrowed memory is only ever reached via mutable_data().
  storage->data_ = static_cast<std::byte*>(const_cast<void*>(data));
  storage->nbytes_ = nbytes;
  storage->owner_ = std::move(owner);
  storage->read_only_ = read_only;
  return storage;
}

Storage::~Storage() {
  if (allocator_) allocator_->deallocate(data_, std::move(reuse_fence_));
}

std::byte* Storage::mutable_data() {
  if (read_only_)
    throw Error("cannot write to a read-only storage (" + std::to_string(nbytes_) +
                " bytes, e.g. weights memory-mapped from a file): copy the tensor first with contiguous_copy()");
  return data_;
}

}  // namespace cubevec
