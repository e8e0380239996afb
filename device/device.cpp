#include "device/device.h"

#include <atomic>

#include <unistd.h>

#include <algorithm>

#include "device/stream_state.h"

namespace cubevec {

struct Device::Units {
  std::unique_ptr<UnitExecutor> cube;
  std::unique_ptr<UnitExecutor> vector;
  // One thread, so MPI is only ever called from one thread per device; it sleeps when idle.
  std::unique_ptr<UnitExecutor> comm;

  explicit Units(const DeviceProfile& p) {
    std::vector<int> cube_cores, vector_cores;
    if (p.pin_units) {  // Cube threads take the first cores, Vector threads the next (wrapping)
      const int cores = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
      for (int i = 0; i < p.cube_threads; ++i) cube_cores.push_back(i % cores);
      for (int i = 0; i < p.vector_threads; ++i) vector_cores.push_back((p.cube_threads + i) % cores);
    }
    cube = std::make_unique<UnitExecutor>("cube", p.cube_threads, cube_cores);
    vector = std::make_unique<UnitExecutor>("vector", p.vector_threads, vector_cores);
    comm = std::make_unique<UnitExecutor>("comm", 1, std::vector<int>{});
  }
};

Device::Device(DeviceProfile profile, DeviceOptions options)
    : profile_(std::move(profile)), options_(options), allocator_(default_allocator()) {
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
  units_.reset();  // stops the dispatchers while the streams they serve still exist
}

Stream Device::new_stream(std::string label) {
  // Stream ids are unique in the process, not per device: a tensor written on one device's stream
  // and read on another device's stream of the same number must still be waited for.
  static std::atomic<StreamTag> next_id{1};
  std::lock_guard lock(mutex_);
  auto state = std::make_shared<StreamState>(*this, next_id.fetch_add(1), std::move(label));
  streams_.push_back(state);
  return Stream(state);
}

Stream Device::named_stream(const std::string& label) {
  {
    std::lock_guard lock(mutex_);
    for (const auto& [name, stream] : named_streams_)
      if (name == label) return stream;
  }
  Stream made = new_stream(label);
  std::lock_guard lock(mutex_);
  for (const auto& [name, stream] : named_streams_)
    if (name == label) return stream;  // another thread made it first
  named_streams_.emplace_back(label, made);
  return made;
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

UnitExecutor& Device::unit(Unit which) {
  switch (which) {
    case Unit::cube: return *units_->cube;
    case Unit::vector: return *units_->vector;
    case Unit::comm: break;
  }
  return *units_->comm;
}

std::pair<double, double> Device::schedule_modelled(const KernelDesc& kernel, double ready_s, const ModelledCost& cost) {
  std::lock_guard lock(mutex_);
  const Unit unit = kernel.unit;
  const auto u = static_cast<std::size_t>(unit);
  const bool host_copy = unit == Unit::comm && kernel.link == KernelDesc::Link::host;
  double& free_s = host_copy ? host_link_free_s_ : unit_free_s_[u];
  const double start = std::max(ready_s, free_s);
  double duration_s = cost.total_s;
  if (profile_.has_kernel_model && unit != Unit::comm) {
    const Unit other = unit == Unit::cube ? Unit::vector : Unit::cube;
    if (unit_free_s_[static_cast<std::size_t>(other)] > start) duration_s = cost.with_shared_hbm(2);
  }
  free_s = start + duration_s;
  stats_.kernels += 1;
  if (host_copy) {
    stats_.host_copies += 1;
    stats_.host_copy_bytes += kernel.bytes;
    stats_.host_copy_modelled_s += duration_s;
  } else {
    stats_.kernels_per_unit[u] += 1;
    stats_.modelled_busy_s[u] += duration_s;
    stats_.bytes_per_unit[u] += kernel.bytes;
    stats_.flops_per_unit[u] += kernel.flops;
  }
  stats_.modelled_makespan_s = std::max(stats_.modelled_makespan_s, start + duration_s);
  return {start, start + duration_s};
}

DeviceStats Device::stats() const {
  DeviceStats s;
  {
    std::lock_guard lock(mutex_);
    s = stats_;
  }
  s.measured_busy_s[static_cast<std::size_t>(Unit::cube)] = units_->cube->busy_seconds();
  s.measured_busy_s[static_cast<std::size_t>(Unit::vector)] = units_->vector->busy_seconds();
  s.measured_busy_s[static_cast<std::size_t>(Unit::comm)] = units_->comm->busy_seconds();
  return s;
}

void Device::reset_stats() {
  std::lock_guard lock(mutex_);
  stats_ = {};
  units_->cube->reset_busy();
  units_->vector->reset_busy();
  units_->comm->reset_busy();
}

void Device::reset_timeline() {
  synchronize();
  // Lock order everywhere: a stream's launch_mutex before the device's mutex_.
  std::vector<std::shared_ptr<StreamState>> streams;
  {
    std::lock_guard lock(mutex_);
    streams = streams_;
  }
  for (const auto& s : streams) {
    std::lock_guard stream_lock(s->launch_mutex);
    s->modelled_clock_s = 0;
  }
  {
    std::lock_guard lock(mutex_);
    stats_ = {};
    unit_free_s_ = {};
    host_link_free_s_ = 0;
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
