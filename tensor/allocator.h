// The allocator interface tensors draw their bytes from, and the reuse fence the device uses to
// make reuse stream-aware.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace cubevec {

// Identifies the stream a block was last used on. 0 is the host / default stream.
using StreamTag = uint64_t;

// Note [Stream-aware reuse]
// A block freed on the host while a stream may still read or write it must not be handed to a
// different stream until that stream has passed the point of the free. The device implements a
// ReuseFence (an event recorded on the stream at free time); the allocator gives a fenced block
// back to requests from the same stream at once (in-order execution makes that safe), and to any
// other stream only once passed() is true.
class ReuseFence {
 public:
  virtual ~ReuseFence() = default;
  virtual bool passed() const = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  Allocator() = default;
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // At least `nbytes` bytes, 64-byte aligned, for use on `stream`. Never returns null.
  virtual void* allocate(std::size_t nbytes, StreamTag stream = 0) = 0;
  // Returns a block from allocate(); `fence`, if given, guards its reuse by other streams.
  virtual void deallocate(void* ptr, std::shared_ptr<const ReuseFence> fence = nullptr) = 0;
};

inline constexpr std::size_t kAllocationAlignment = 64;

}  // namespace cubevec
