// UnitExecutor: one compute unit of the emulated device (Cube or Vector). A dispatcher thread
// takes jobs in order and runs them inside the unit's tbb::task_arena, so a kernel's
// tbb::parallel_for uses exactly that unit's threads. The unit runs one kernel at a time, as the
// cost model assumes. Hand-offs go through a mutex, which also keeps ThreadSanitizer informed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>

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
  const pid_t owner_pid_;  // the process whose threads these are (a forked child has none of them)
  std::unique_ptr<tbb::task_arena> arena_;
  // What the dispatcher shares with submitters. On the heap so that a forked child can leave it
  // behind: its condition variable had a waiter in the parent, and destroying it would wait for
  // that waiter forever.
  struct Queue {
    std::mutex mutex;
    std::condition_variable has_work;
    std::deque<std::function<void()>> jobs;
    std::atomic<std::size_t> queued{0};  // jobs.size(), readable without the mutex while spinning
    bool stopping = false;
    double busy_s = 0;  // under mutex
  };
  std::unique_ptr<Queue> queue_ = std::make_unique<Queue>();
  std::thread dispatcher_;
  class Pinner;
  std::unique_ptr<Pinner> pinner_;
};

}  // namespace cubevec
