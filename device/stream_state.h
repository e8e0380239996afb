// Internal: the queue behind a Stream, run as a strand. At most one task of a stream is in flight;
// a kernel task goes to its unit's executor, and when it finishes that thread pumps the stream on.
// Waits never block a thread: the stream parks itself on the event and resumes when it is reached.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "device/event.h"
#include "device/kernel.h"
#include "device/trace.h"
#include "tensor/storage.h"

namespace cubevec {

class Device;

struct StreamTask {
  enum class Kind { kernel, record, wait } kind = Kind::kernel;
  std::shared_ptr<EventState> event;  // kernel: its completion; record: the event; wait: the awaited one
  std::string name;                   // kernel name, for error messages
  Unit unit = Unit::vector;
  KernelBody body;
  std::vector<std::shared_ptr<Storage>> keep_alive;  // storages the kernel touches
  KernelRecord* record = nullptr;                    // trace record, if tracing
};

class StreamState : public std::enable_shared_from_this<StreamState> {
 public:
  StreamState(Device& owner, StreamTag tag, std::string name) : device(owner), id(tag), label(std::move(name)) {}

  void push(StreamTask task);
  // Runs queued records and waits until the queue is empty, the stream must wait for an event, or a
  // kernel has been handed to its unit (which pumps again when the kernel is done).
  void pump();
  // The first failure not yet reported by synchronize(); clears it.
  std::string take_failure();

  Device& device;
  const StreamTag id;
  const std::string label;

  // Host-side launch state, under launch_mutex.
  std::mutex launch_mutex;
  double modelled_clock_s = 0;
  double modelled_host_s = 0;  // when the modelled host has issued this stream's kernels so far
  // The kernels launched and not known to have run, oldest first, with the bytes each writes: the
  // host waits when there are too many or they write too much (see Stream::launch).
  struct InFlight {
    std::shared_ptr<EventState> event;
    std::size_t bytes;
  };
  std::deque<InFlight> in_flight;
  std::size_t in_flight_bytes = 0;

 private:
  void run_kernel(StreamTask& task);
  void absorb(const EventState& awaited);
  std::string failure();

  std::mutex queue_mutex_;
  std::deque<StreamTask> queue_;
  bool active_ = false;  // a pump owns the queue (running, or parked on an event)
  std::string failure_;
};

}  // namespace cubevec
