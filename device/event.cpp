#include "device/event.h"

#include "device/spin_wait.h"
#include "base/error.h"
#include "base/interrupt.h"

namespace cubevec {

namespace {
thread_local bool t_inside_kernel = false;
}

bool inside_kernel() { return t_inside_kernel; }
void set_inside_kernel(bool inside) { t_inside_kernel = inside; }

bool EventState::passed() const { return done_.load(std::memory_order_acquire); }

void EventState::host_wait() const {
  if (t_inside_kernel) return;
  // Short waits are common (a just-launched kernel): spin first, sleep only if that was not enough.
  spin_until([&] { return passed(); }, kSpinSeconds);
  std::unique_lock lock(mutex_);
  reached_.wait(lock, [&] { return done_.load(); });
  if (error_.empty()) return;
  // A kernel that failed because the run is being stopped (one waiting for the tuning file's
  // lock, say) ends the run as the signal does, not as that kernel's failure.
  if (const int signal = interrupt_signal()) throw Interrupted(signal);
  throw Error(error_);
}

void EventState::complete(std::string error) {
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard lock(mutex_);
    if (done_.load()) return;
    done_.store(true, std::memory_order_release);
    error_ = std::move(error);
    callbacks.swap(callbacks_);
  }
  reached_.notify_all();
  for (auto& callback : callbacks) callback();
}

void EventState::on_complete(std::function<void()> callback) {
  {
    std::lock_guard lock(mutex_);
    if (!done_.load()) {
      callbacks_.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

std::string EventState::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

}  // namespace cubevec
