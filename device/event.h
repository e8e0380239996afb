// Event: a point in a stream's work. Recorded on one stream, it can be waited for by another stream
// or by the host. If the work before it failed, the event carries that failure ("poisoned"): a
// stream that waits for it fails too, and the host's synchronize() rethrows it, so nothing hangs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensor/stream_fence.h"

namespace cubevec {

class EventState final : public StreamFence {
 public:
  EventState(StreamTag stream, double modelled_time_s) : stream_(stream), modelled_time_s_(modelled_time_s) {}

  bool passed() const override;
  void host_wait() const override;  // throws cubevec::Error carrying the failure, if any
  StreamTag stream() const override { return stream_; }

  // Marks the event reached; `error` non-empty poisons it. Runs the callbacks registered so far.
  void complete(std::string error = {});
  // Runs `callback` once the event is reached: now (on this thread) if it already is.
  void on_complete(std::function<void()> callback);
  // Empty unless poisoned; only meaningful once passed().
  std::string error() const;
  // When the modelled NPU reaches this point.
  double modelled_time_s() const { return modelled_time_s_; }

 private:
  const StreamTag stream_;
  const double modelled_time_s_;
  mutable std::mutex mutex_;
  mutable std::condition_variable reached_;
  std::atomic<bool> done_{false};  // written under mutex_, read without it by passed()
  std::string error_;
  std::vector<std::function<void()>> callbacks_;
};

// The handle users hold. A default-constructed Event is already reached.
class Event {
 public:
  Event() = default;
  explicit Event(std::shared_ptr<EventState> state) : state_(std::move(state)) {}

  bool query() const { return !state_ || state_->passed(); }
  // Blocks until reached; rethrows the failure of the work before it.
  void synchronize() const {
    if (state_) state_->host_wait();
  }
  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  std::shared_ptr<EventState> state_;
};

// True on a thread that is running a kernel body (host waits there would deadlock, and are not
// needed: the device ordered the kernel after its dependencies).
bool inside_kernel();
void set_inside_kernel(bool inside);

}  // namespace cubevec
