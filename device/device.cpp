#include "device/device.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <tbb/global_control.h>
#include <tbb/task_scheduler_observer.h>

#include "device/stream_state.h"

namespace cubevec {

namespace {

// TBB sizes its worker pool to the core count minus one by default; two arenas that should run at
// the same time need workers for both, so the pool is raised to what the devices ask for.
void ensure_tbb_workers(int threads) {
  static std::mutex mutex;
  static std::unique_ptr<tbb::global_control> control;
  static int current = 0;
  std::lock_guard lock(mutex);
  if (threads <= current) return;
  control = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                  static_cast<std::size_t>(threads));
  current = threads;
}

// Pins the threads that join an arena to a fixed set of cores.
class CorePinner final : public tbb::task_scheduler_observer {
 public:
  CorePinner(tbb::task_arena& arena, std::vector<int> cores) : tbb::task_scheduler_observer(arena), cores_(std::move(cores)) {
    observe(true);
  }
  ~CorePinner() override { observe(false); }
  void on_scheduler_entry(bool) override {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int core : cores_) CPU_SET(core, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  }

 private:
  std::vector<int> cores_;
};

}  // namespace

struct Device::Units {
  tbb::task_arena cube;
  tbb::task_arena vector;
  std::vector<std::unique_ptr<CorePinner>> pinners;

  Units(const DeviceProfile& p)
      : cube(p.cube_threads, /*reserved_for_masters=*/0), vector(p.vector_threads, /*reserved_for_masters=*/0) {
    cube.initialize();
    vector.initialize();
    if (!p.pin_units) return;
    // Cube threads take the first cores, Vector threads the next ones (wrapping on small machines).
    const int cores = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
    std::vector<int> cube_cores, vector_cores;
    for (int i = 0; i < p.cube_threads; ++i) cube_cores.push_back(i % cores);
    for (int i = 0; i < p.vector_threads; ++i) vector_cores.push_back((p.cube_threads + i) % cores);
    pinners.push_back(std::make_unique<CorePinner>(cube, cube_cores));
    pinners.push_back(std::make_unique<CorePinner>(vector, vector_cores));
  }
};

Device::Device(DeviceProfile profile, DeviceOptions options)
    : profile_(std::move(profile)), options_(options), allocator_(default_allocator()) {
  ensure_tbb_workers(profile_.cube_threads + profile_.vector_threads + 1);
  units_ = std::make_unique<Units>(profile_);
  default_stream_ = std::make_unique<Stream>(new_stream("default"));
}

Device::~Device() {
  std::vector<std::shared_ptr<StreamState>> streams;
  {
    std::lock_guard lock(mutex_);
    streams = streams_;
  }
  for (const auto& s : streams) {
    try {
      Stream(s).synchronize();
    } catch (const std::exception&) {
      // Nobody is left to report it to; the work has drained, which is what matters here.
    }
  }
  units_.reset();  // the arenas finish their bookkeeping before the streams go
}

Stream Device::new_stream(std::string label) {
  std::lock_guard lock(mutex_);
  auto state = std::make_shared<StreamState>(*this, next_stream_id_++, std::move(label));
  streams_.push_back(state);
  return Stream(state);
}

void Device::synchronize() {
  std::vector<std::shared_ptr<StreamState>> streams;
  {
    std::lock_guard lock(mutex_);
    streams = streams_;
  }
  std::exception_ptr first;
  for (const auto& s : streams) {
    try {
      Stream(s).synchronize();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

Tensor Device::empty(Shape shape, DType dtype, const Stream& stream) {
  if (options_.simulate) return Tensor::meta(std::move(shape), dtype);
  return Tensor::empty(std::move(shape), dtype, allocator_, stream.id());
}

tbb::task_arena& Device::arena(Unit unit) { return unit == Unit::cube ? units_->cube : units_->vector; }

double Device::schedule_modelled(Unit unit, double ready_s, double duration_s) {
  std::lock_guard lock(mutex_);
  const auto u = static_cast<std::size_t>(unit);
  const double start = std::max(ready_s, unit_free_s_[u]);
  unit_free_s_[u] = start + duration_s;
  stats_.kernels += 1;
  stats_.kernels_per_unit[u] += 1;
  stats_.modelled_busy_s[u] += duration_s;
  stats_.modelled_makespan_s = std::max(stats_.modelled_makespan_s, start + duration_s);
  return start;
}

DeviceStats Device::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void Device::reset_stats() {
  std::lock_guard lock(mutex_);
  stats_ = {};
}

void Device::reset_timeline() {
  synchronize();
  std::lock_guard lock(mutex_);
  stats_ = {};
  unit_free_s_ = {};
  for (const auto& s : streams_) {
    std::lock_guard stream_lock(s->launch_mutex);
    s->modelled_clock_s = 0;
  }
  trace_.clear();
}

namespace {
std::mutex g_default_mutex;
std::unique_ptr<DeviceProfile> g_default_profile;
DeviceOptions g_default_options;
bool g_default_made = false;
}  // namespace

Device& default_device() {
  static Device* device = [] {
    std::lock_guard lock(g_default_mutex);
    g_default_made = true;
    DeviceProfile profile = g_default_profile ? *g_default_profile : builtin_cpu_profile();
    if (!g_default_profile) apply_thread_overrides(profile);
    // Leaked on purpose: tensors that outlive main() may still release storage through it.
    return new Device(std::move(profile), g_default_options);
  }();
  return *device;
}

void set_default_device_profile(DeviceProfile profile, DeviceOptions options) {
  std::lock_guard lock(g_default_mutex);
  if (g_default_made) throw Error("set_default_device_profile: the default device is already in use");
  g_default_profile = std::make_unique<DeviceProfile>(std::move(profile));
  g_default_options = options;
}

}  // namespace cubevec
