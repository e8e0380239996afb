#include "device/unit_executor.h"

#include <chrono>

#include <pthread.h>
#include <unistd.h>
#include <sched.h>

#include <tbb/global_control.h>

#include "device/spin_wait.h"
#include <tbb/task_scheduler_observer.h>

namespace cubevec {

namespace {

void pin_current_thread(const std::vector<int>& cores) {
  if (cores.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int core : cores) CPU_SET(core, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

// TBB sizes its worker pool to the core count minus one by default; arenas that must run at the
// same time need workers for all of them, so the pool grows to what the units ask for.
void ensure_tbb_workers(int extra_workers) {
  static std::mutex mutex;
  static std::unique_ptr<tbb::global_control> control;
  static int total = 1;  // the main thread
  std::lock_guard lock(mutex);
  total += extra_workers;
  control = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(total));
}

}  // namespace

// Pins TBB workers as they join the arena (the dispatcher pins itself).
class UnitExecutor::Pinner final : public tbb::task_scheduler_observer {
 public:
  Pinner(tbb::task_arena& arena, std::vector<int> cores) : tbb::task_scheduler_observer(arena), cores_(std::move(cores)) { observe(true); }
  ~Pinner() override { observe(false); }
  void on_scheduler_entry(bool) override { pin_current_thread(cores_); }

 private:
  std::vector<int> cores_;
};

UnitExecutor::UnitExecutor(std::string name, int threads, std::vector<int> cores)
    : name_(std::move(name)),
      threads_(threads),
      owner_pid_(::getpid()),
      arena_(std::make_unique<tbb::task_arena>(threads, /*reserved_for_masters=*/1)) {
  ensure_tbb_workers(threads - 1);
  arena_->initialize();
  if (!cores.empty()) pinner_ = std::make_unique<Pinner>(*arena_, cores);
  dispatcher_ = std::thread([this, cores] {
    pthread_setname_np(pthread_self(), ("cubevec-" + name_).substr(0, 15).c_str());
    pin_current_thread(cores);
    arena_->execute([this] { dispatch_loop(); });
  });
}

UnitExecutor::~UnitExecutor() {
  if (::getpid() != owner_pid_) {
    // A forked child (a Python process that forked after cubevec ran, exiting normally): the
    // dispatcher and TBB's workers stayed in the parent, and waiting for them would never end.
    // What they own is left to the process's exit.
    new std::thread(std::move(dispatcher_));  // NOLINT: leaked on purpose (a joinable thread's destructor aborts)
    (void)pinner_.release();
    (void)arena_.release();
    (void)queue_.release();
    return;
  }
  {
    std::lock_guard lock(queue_->mutex);
    queue_->stopping = true;
  }
  queue_->has_work.notify_one();
  dispatcher_.join();
  pinner_.reset();
}

void UnitExecutor::submit(std::function<void()> job) {
  // Notified under the lock: the job may run (a spinning dispatcher takes it as soon as the lock is
  // free), finish the stream's last work and let the owner destroy this executor, which must not
  // happen while this thread still signals its condition variable (ThreadSanitizer saw it, from a
  // stream pumped by another unit's dispatcher).
  std::lock_guard lock(queue_->mutex);
  queue_->jobs.push_back(std::move(job));
  queue_->queued.store(queue_->jobs.size(), std::memory_order_release);
  queue_->has_work.notify_one();
}

void UnitExecutor::dispatch_loop() {
  while (true) {
    // Kernels tend to arrive right behind each other: spin briefly before sleeping, which saves
    // the tens of microseconds a futex wake-up costs.
    spin_until([&] { return queue_->queued.load(std::memory_order_acquire) != 0; }, kSpinSeconds);
    std::function<void()> job;
    {
      std::unique_lock lock(queue_->mutex);
      queue_->has_work.wait(lock, [&] { return queue_->stopping || !queue_->jobs.empty(); });
      if (queue_->jobs.empty()) return;  // stopping, and nothing left
      job = std::move(queue_->jobs.front());
      queue_->jobs.pop_front();
      queue_->queued.store(queue_->jobs.size(), std::memory_order_release);
    }
    const auto start = std::chrono::steady_clock::now();
    job();  // jobs catch their own exceptions (StreamState::run_kernel)
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard lock(queue_->mutex);
    queue_->busy_s += seconds;
  }
}

double UnitExecutor::busy_seconds() const {
  std::lock_guard lock(queue_->mutex);
  return queue_->busy_s;
}

void UnitExecutor::reset_busy() {
  std::lock_guard lock(queue_->mutex);
  queue_->busy_s = 0;
}

}  // namespace cubevec
