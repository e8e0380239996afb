// Storage: the bytes behind one or more tensors. Either owned (from an Allocator, returned to it on
// destruction) or borrowed (e.g. a region of a memory-mapped file, kept alive by a shared owner).
// A storage also remembers the device work that last wrote it and that reads it since, so host
// access waits for that work and freed bytes are reused safely (see stream_fence.h).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "tensor/allocator.h"

namespace cubevec {

class Storage {
 public:
  // Owned bytes from `allocator` (which must outlive the storage), for use on `stream`.
  static std::shared_ptr<Storage> allocate(std::size_t nbytes, Allocator& allocator, StreamTag stream = kHostStream);
  // Borrowed bytes; `owner` keeps them valid. Read-only storages refuse mutable access.
  // `file_mapped`: the bytes are a read-only private mapping of a file (never written), whose
  // pages the OS can drop and read back (release_file_pages).
  static std::shared_ptr<Storage> borrow(const void* data, std::size_t nbytes, std::shared_ptr<const void> owner, bool read_only,
                                         bool file_mapped = false);

  // No bytes at all: the storage of a meta tensor (simulate mode). It still tracks device uses, so
  // simulated work is ordered exactly as real work would be.
  static std::shared_ptr<Storage> meta(std::size_t nbytes);

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // Host access: waits for the device work that writes these bytes (and, to write, reads them).
  const std::byte* data() const;
  std::byte* mutable_data();  // throws cubevec::Error on read-only storage
  // No waiting: only for code the device has already ordered after that work (kernel launches).
  std::byte* unsynchronized_data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  bool read_only() const { return read_only_; }
  bool is_meta() const { return meta_; }
  bool file_mapped() const { return file_mapped_; }
  // Hands the whole pages inside [offset, offset + nbytes) back to the OS (they leave the resident
  // set and are read from the file again on the next access). Returns the bytes released; 0 for a
  // storage that is not file-mapped (other memory would lose its contents).
  std::size_t release_file_pages(std::size_t offset, std::size_t nbytes) const;
  // Asks the OS to start reading those pages of a file-mapped storage now (readahead), so a reader
  // that comes next does not fault on each page; nothing for other storages.
  void prefetch_file_pages(std::size_t offset, std::size_t nbytes) const;
  // From now on the bytes are immutable (weights shared by several model instances): mutable access
  // throws, and reads need no tracking. Call before the storage is shared between threads.
  void freeze() { read_only_ = true; }

  // Device bookkeeping of pending uses.
  struct Uses {
    FencePtr writer;
    std::vector<FencePtr> readers;  // reads since the last write, the latest per stream
  };
  Uses uses() const;
  void record_write(FencePtr fence);  // becomes the last writer; earlier readers are covered by it
  void record_read(FencePtr fence);

 private:
  Storage() = default;
  void check_writable() const;

  std::byte* data_ = nullptr;
  std::size_t nbytes_ = 0;
  bool read_only_ = false;
  bool meta_ = false;
  bool file_mapped_ = false;
  Allocator* allocator_ = nullptr;     // set when owned
  std::shared_ptr<const void> owner_;  // set when borrowed
  mutable std::mutex uses_mutex_;
  Uses uses_;
};

}  // namespace cubevec
