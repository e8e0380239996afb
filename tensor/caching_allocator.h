// CachingAllocator: keeps freed blocks in size classes and hands them out again instead of
// returning memory to the OS. Thread-safe. Stream-aware through StreamFence (allocator.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/allocator.h"

namespace cubevec {

struct AllocatorStats {
  std::size_t live_bytes = 0;       // bytes in blocks handed out (class sizes)
  std::size_t peak_live_bytes = 0;  // high-water mark of live_bytes
  std::size_t cached_bytes = 0;     // bytes in freed blocks kept for reuse (fenced ones included)
  std::size_t reserved_bytes = 0;   // live + cached: what the allocator holds from the OS
  std::size_t peak_reserved_bytes = 0;
  uint64_t hits = 0;    // requests served from the cache
  uint64_t misses = 0;  // requests that had to ask the OS
  uint64_t os_allocations = 0;
  uint64_t os_frees = 0;
  std::size_t live_blocks = 0;
  std::size_t cached_blocks = 0;
};

std::string format_stats(const AllocatorStats& stats);
// "512 B", "1.50 KiB", "12.34 GiB"
std::string human_bytes(std::size_t bytes);
// "12.3 MiB": always in MiB, with `decimals` digits after the point (reports that compare sizes).
std::string mib(std::size_t bytes, int decimals = 1);

class CachingAllocator final : public Allocator {
 public:
  // memory_limit: most bytes the allocator may hold from the OS (live + cached); 0 = no limit.
  explicit CachingAllocator(std::size_t memory_limit = 0);
  ~CachingAllocator() override;

  void* allocate(std::size_t nbytes, StreamTag stream = kHostStream) override;
  void deallocate(void* ptr, FencePtr fence = nullptr) override;

  // Returns every cached block whose reuse is not fenced to the OS.
  void empty_cache();
  void set_memory_limit(std::size_t bytes);
  std::size_t memory_limit() const;
  AllocatorStats stats() const;
  void reset_peak_stats();

  // The size class a request of `nbytes` is served from: a multiple of 64, at most 12.5% over the
  // request for large sizes (eight steps per power of two), and 64 bytes for tiny requests.
  static std::size_t size_class(std::size_t nbytes);

 private:
  struct CachedBlock {
    void* ptr;
    FencePtr fence;  // null: free for every stream
  };

  // The smallest usable cached block of `size` to `largest` bytes (null if none).
  void* take_cached(std::size_t size, std::size_t largest, StreamTag stream);
  void* allocate_from_os(std::size_t size, std::size_t requested);
  void release_cache(bool keep_fenced);
  void record_live(void* ptr, std::size_t size);

  mutable std::mutex mutex_;
  std::size_t memory_limit_;
  AllocatorStats stats_;
  std::map<std::size_t, std::vector<CachedBlock>> cache_;  // size class -> free blocks
  std::unordered_map<void*, std::size_t> live_;            // block -> its size
};

// The process-wide allocator that tensors use unless given another.
CachingAllocator& default_allocator();

}  // namespace cubevec
