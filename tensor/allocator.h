// The allocator interface tensors draw their bytes from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "tensor/stream_fence.h"

namespace cubevec {

// Note [Stream-aware reuse]
// A block freed on the host while a stream may still read or write it must not be handed to a
// different stream until that stream has passed the point of the free. Storage passes the fence of
// its last uses to deallocate(); the allocator gives a fenced block back at once to requests from
// the fence's own stream (in-order execution makes that safe), and to any other stream only once
// the fence has passed.
class Allocator {
 public:
  virtual ~Allocator() = default;
  Allocator() = default;
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // At least `nbytes` bytes, 64-byte aligned, for use on `stream`. Never returns null.
  virtual void* allocate(std::size_t nbytes, StreamTag stream = kHostStream) = 0;
  // Returns a block from allocate(); `fence`, if given, guards its reuse by other streams.
  virtual void deallocate(void* ptr, FencePtr fence = nullptr) = 0;
};

inline constexpr std::size_t kAllocationAlignment = 64;

}  // namespace cubevec
