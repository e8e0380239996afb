// Device: the emulated Ascend device. It owns a Cube unit and a Vector unit (each a dispatcher and
// a tbb::task_arena with its own threads, see unit_executor.h), a communication unit (one thread,
// for collectives between devices), the streams, the allocator its tensors use, the trace and the
// cost model.
//
// Note [Implicit dependencies]
// Every storage remembers the completion event of the kernel that last wrote it and of the reads
// since (tensor/storage.h). A launch on stream S that reads a tensor waits for its last writer if
// that ran on another stream; a launch that writes a tensor also waits for the readers on other
// streams. Host access to tensor data (Tensor::data_ptr) waits for the writer, and mutable access
// for the readers too. Freed bytes go back to the allocator fenced by those events, so another
// stream cannot get them while they are in use. So correctness never depends on the caller
// remembering to synchronize; explicit events are only needed to order work that shares no tensor.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "device/cost_model.h"
#include "device/device_profile.h"
#include "device/stream.h"
#include "device/trace.h"
#include "device/unit_executor.h"
#include "tensor/caching_allocator.h"
#include "tensor/tensor.h"

namespace cubevec {

struct DeviceOptions {
  // Shape-only run: kernels record their cost on the modelled timeline but their bodies never run,
  // and Device::empty makes meta tensors.
  bool simulate = false;
  // Keep a KernelRecord per launch (needed for --trace and for measured per-unit busy time).
  bool trace = false;
};

// Totals since the device was made (or reset_stats()).
struct DeviceStats {
  uint64_t kernels = 0;
  std::array<double, kUnitCount> modelled_busy_s{};  // per unit: the sum of modelled kernel times
  double modelled_makespan_s = 0;                    // when the last modelled kernel ends
  std::array<uint64_t, kUnitCount> kernels_per_unit{};
  std::array<double, kUnitCount> bytes_per_unit{};   // the kernels' declared bytes (comm: over the busiest link)
  std::array<double, kUnitCount> flops_per_unit{};   // the kernels' declared flops
  std::array<double, kUnitCount> measured_busy_s{};  // per unit: seconds its thread(s) spent running kernels here
  // Host-to-device copies (comm-unit kernels on the host link, weight streaming's), kept out of
  // the comm unit's figures above: they have a timeline of their own, beside the collectives'.
  uint64_t host_copies = 0;
  double host_copy_bytes = 0;
  double host_copy_modelled_s = 0;
};

class Device {
 public:
  explicit Device(DeviceProfile profile, DeviceOptions options = {});
  ~Device();  // waits for all work; failures not yet reported are dropped
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceProfile& profile() const { return profile_; }
  bool simulate() const { return options_.simulate; }
  bool tracing() const { return options_.trace; }

  Stream new_stream(std::string label = "");
  // The stream that work goes to when none is named; created with the device.
  Stream default_stream() const { return *default_stream_; }
  // A stream the device owns, made on the first request for `label` and the same one afterwards:
  // for ops that need a second stream of their own (the Vector half of CV-pipelined attention).
  Stream named_stream(const std::string& label);
  // Waits for every stream; rethrows the first failure found.
  void synchronize();

  // A new tensor for work on `stream` (a meta tensor in simulate mode).
  Tensor empty(Shape shape, DType dtype, const Stream& stream);
  CachingAllocator& allocator() { return allocator_; }

  Trace& trace() { return trace_; }
  DeviceStats stats() const;
  void reset_stats();
  // Starts the modelled clocks again at zero (and the trace's), e.g. between experiment runs.
  void reset_timeline();

  // Internal, for streams: the executor of a unit, and the modelled-unit bookkeeping of a launch.
  UnitExecutor& unit(Unit which);
  // Places `kernel` of `cost` that may start at `ready_s` on its unit (a host-link copy: on the
  // host link's own timeline); returns its start and end (the HBM shared with the other unit when
  // it is still busy, see device/cost_model.h).
  std::pair<double, double> schedule_modelled(const KernelDesc& kernel, double ready_s, const ModelledCost& cost);

 private:
  DeviceProfile profile_;
  DeviceOptions options_;
  CachingAllocator& allocator_;
  struct Units;
  std::unique_ptr<Units> units_;
  Trace trace_;

  mutable std::mutex mutex_;  // streams_, stats_, unit_free_s_
  std::vector<std::shared_ptr<StreamState>> streams_;
  std::unique_ptr<Stream> default_stream_;
  std::vector<std::pair<std::string, Stream>> named_streams_;
  std::array<double, kUnitCount> unit_free_s_{};
  double host_link_free_s_ = 0;
  DeviceStats stats_;
};

// The process-wide device: made on first use from the profile set by set_default_device_profile(),
// else from the built-in cpu-default profile with CUBEVEC_*_THREADS applied.
Device& default_device();
// Must be called before default_device() is first used; throws otherwise.
void set_default_device_profile(DeviceProfile profile, DeviceOptions options = {});

}  // namespace cubevec
