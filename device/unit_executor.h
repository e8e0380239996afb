// UnitExecutor: one compute unit of the emulated device (Cube or Vector). A dispatcher thread
// takes jobs in order and runs them inside the unit's tbb::task_arena, so a kernel's
// tbb::parallel_for uses exactly that unit's threads. The unit runs one kernel at a time, as the
// cost model assumes. Hand-offs go through a mutex, which also keeps ThreadSanitizer informed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <tbb/task_arena.h>

namespace cubevec {

class UnitExecutor {
 public:
  // `threads` includes the dispatcher; `cores`, if not empty, pins all of them to those cores.
  UnitExecutor(std::string name, int threads, std::vector<int> cores);
  ~UnitExecutor();  // runs the jobs already submitted, then stops
  UnitExecutor(const UnitExecutor&) = delete;
  UnitExecutor& operator=(const UnitExecutor&) = delete;

  void submit(std::function<void()> job);
  int threads() const { return threads_; }
  // Seconds the unit spent running jobs since it was made (or reset_busy()).
  double busy_seconds() const;
  void reset_busy();

 private:
  void dispatch_loop();

  const std::string name_;
  const int threads_;
  tbb::task_arena arena_;
  mutable std::mutex mutex_;
  std::condition_variable has_work_;
  std::deque<std::function<void()>> jobs_;
  std::atomic<std::size_t> queued_{0};  // jobs_.size(), readable without the mutex while spinning
  bool stopping_ = false;
  double busy_s_ = 0;  // under mutex_
  std::thread dispatcher_;
  class Pinner;
  std::unique_ptr<Pinner> pinner_;
};

}  // namespace cubevec
