#include "tensor/storage.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

#include "base/error.h"

namespace cubevec {

std::shared_ptr<Storage> Storage::allocate(std::size_t nbytes, Allocator& allocator, StreamTag stream) {
  std::shared_ptr<Storage> storage(new Storage());
  storage->data_ = static_cast<std::byte*>(allocator.allocate(nbytes, stream));
  storage->nbytes_ = nbytes;
  storage->allocator_ = &allocator;
  return storage;
}

std::shared_ptr<Storage> Storage::borrow(const void* data, std::size_t nbytes, std::shared_ptr<const void> owner, bool read_only,
                                         bool file_mapped) {
  std::shared_ptr<Storage> storage(new Storage());
  // const_cast is confined here: writable borrowed memory is only ever reached via mutable_data().
  storage->data_ = static_cast<std::byte*>(const_cast<void*>(data));
  storage->nbytes_ = nbytes;
  storage->owner_ = std::move(owner);
  storage->read_only_ = read_only;
  storage->file_mapped_ = file_mapped && read_only;
  return storage;
}

void Storage::prefetch_file_pages(std::size_t offset, std::size_t nbytes) const {
  if (!file_mapped_ || offset >= nbytes_) return;
  nbytes = std::min(nbytes, nbytes_ - offset);
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(data_ + offset) / page * page;
  const auto end = reinterpret_cast<std::uintptr_t>(data_ + offset) + nbytes;
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_WILLNEED);  // advice only: failure is harmless
}

std::size_t Storage::release_file_pages(std::size_t offset, std::size_t nbytes) const {
  if (!file_mapped_ || offset >= nbytes_) return 0;
  nbytes = std::min(nbytes, nbytes_ - offset);
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(data_ + offset), end = begin + nbytes;
  const std::uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last <= first) return 0;
  if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) return 0;
  return last - first;
}

std::shared_ptr<Storage> Storage::meta(std::size_t nbytes) {
  std::shared_ptr<Storage> storage(new Storage());
  storage->nbytes_ = nbytes;
  storage->meta_ = true;
  return storage;
}

Storage::~Storage() {
  if (!allocator_) return;
  // The bytes go back once every pending use has passed (Note [Stream-aware reuse]).
  std::vector<FencePtr> pending;
  if (uses_.writer && !uses_.writer->passed()) pending.push_back(uses_.writer);
  for (const auto& r : uses_.readers)
    if (!r->passed()) pending.push_back(r);
  FencePtr fence;
  if (pending.size() == 1) fence = pending[0];
  if (pending.size() > 1) fence = std::make_shared<FenceSet>(std::move(pending));
  allocator_->deallocate(data_, std::move(fence));
}

const std::byte* Storage::data() const {
  FencePtr writer;
  {
    std::lock_guard lock(uses_mutex_);
    writer = uses_.writer;
  }
  if (writer) writer->host_wait();
  return data_;
}

void Storage::check_writable() const {
  if (read_only_)
    throw Error("cannot write to a read-only storage (" + std::to_string(nbytes_) +
                " bytes, e.g. weights memory-mapped from a file): copy the tensor first with clone()");
}

std::byte* Storage::mutable_data() {
  check_writable();
  const Uses pending = uses();
  if (pending.writer) pending.writer->host_wait();
  for (const auto& r : pending.readers) r->host_wait();
  return data_;
}

Storage::Uses Storage::uses() const {
  std::lock_guard lock(uses_mutex_);
  return uses_;
}

void Storage::record_write(FencePtr fence) {
  check_writable();
  std::lock_guard lock(uses_mutex_);
  uses_.writer = std::move(fence);
  uses_.readers.clear();
}

void Storage::record_read(FencePtr fence) {
  if (read_only_) return;  // nothing can write it later, so nothing needs to wait for this read
  std::lock_guard lock(uses_mutex_);
  std::erase_if(uses_.readers, [&](const FencePtr& r) { return r->stream() == fence->stream() || r->passed(); });
  uses_.readers.push_back(std::move(fence));
}

}  // namespace cubevec
