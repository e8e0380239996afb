#include "device/stream_state.h"

#include "device/device.h"

namespace cubevec {

void StreamState::push(StreamTask task) {
  bool start = false;
  {
    std::lock_guard lock(queue_mutex_);
    queue_.push_back(std::move(task));
    start = !active_;
    active_ = true;
  }
  if (start) pump();
}

void StreamState::pump() {
  while (true) {
    StreamTask task;
    {
      std::lock_guard lock(queue_mutex_);
      if (queue_.empty()) {
        active_ = false;
        return;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    switch (task.kind) {
      case StreamTask::Kind::record: task.event->complete(failure()); continue;
      case StreamTask::Kind::wait: {
        if (task.event->passed()) {
          absorb(*task.event);
          continue;
        }
        // Park: whoever reaches the event resumes this stream.
        auto self = shared_from_this();
        auto awaited = task.event;
        awaited->on_complete([self, awaited] {
          self->absorb(*awaited);
          self->pump();
        });
        return;
      }
      case StreamTask::Kind::kernel:
        // Always through the unit's queue, even from that unit's own thread: kernels of all
        // streams then share the unit in submission order.
        auto self = shared_from_this();
        auto shared_task = std::make_shared<StreamTask>(std::move(task));
        device.unit(shared_task->unit).submit([self, shared_task] {
          self->run_kernel(*shared_task);
          self->pump();
        });
        return;
    }
  }
}

void StreamState::run_kernel(StreamTask& task) {
  std::string error = failure();
  const bool run = error.empty() && !device.simulate();
  if (run) {
    if (task.record) task.record->real_start_s = device.trace().now_s();
    set_inside_kernel(true);
    try {
      task.body();
    } catch (const std::exception& e) {
      error = "kernel '" + task.name + "' on the " + std::string(unit_name(task.unit)) + " unit, stream " + std::to_string(id) +
              ", failed: " + e.what();
    } catch (...) {
      error = "kernel '" + task.name + "' on stream " + std::to_string(id) + " failed with a non-standard exception";
    }
    set_inside_kernel(false);
    if (task.record) {
      task.record->real_end_s = device.trace().now_s();
      task.record->ran = true;
    }
    if (!error.empty()) {
      std::lock_guard lock(queue_mutex_);
      if (failure_.empty()) failure_ = error;
    }
  }
  task.body = nullptr;  // drop captures before the event releases waiters
  task.event->complete(error);
  task.keep_alive.clear();
}

void StreamState::absorb(const EventState& awaited) {
  const std::string error = awaited.error();
  if (error.empty()) return;
  std::lock_guard lock(queue_mutex_);
  if (failure_.empty()) failure_ = "waited for work that failed on stream " + std::to_string(awaited.stream()) + ": " + error;
}

std::string StreamState::failure() {
  std::lock_guard lock(queue_mutex_);
  return failure_;
}

std::string StreamState::take_failure() {
  std::lock_guard lock(queue_mutex_);
  return std::exchange(failure_, {});
}

}  // namespace cubevec
