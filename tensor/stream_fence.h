// StreamFence: a point in a device stream's work, seen from the tensor layer. The device implements
// it with its events; tensor/ uses it to make host access and memory reuse safe without knowing
// about devices (see Note [Implicit dependencies] in device/device.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace cubevec {

// Identifies a stream. 0 is the host (no stream); kSeveralStreams marks use by more than one.
using StreamTag = uint64_t;
inline constexpr StreamTag kHostStream = 0;
inline constexpr StreamTag kSeveralStreams = UINT64_MAX;

class StreamFence {
 public:
  virtual ~StreamFence() = default;
  // True once the stream has run everything before this point.
  virtual bool passed() const = 0;
  // Blocks the calling host thread until passed(); throws cubevec::Error if that work failed.
  // Called from inside a device kernel it returns at once: the device already ordered the kernel.
  virtual void host_wait() const = 0;
  virtual StreamTag stream() const = 0;
};

using FencePtr = std::shared_ptr<const StreamFence>;

// Passed when all of its fences have passed; its stream is theirs if they share one.
class FenceSet final : public StreamFence {
 public:
  explicit FenceSet(std::vector<FencePtr> fences);
  bool passed() const override;
  void host_wait() const override;
  StreamTag stream() const override { return stream_; }

 private:
  std::vector<FencePtr> fences_;
  StreamTag stream_;
};

}  // namespace cubevec
