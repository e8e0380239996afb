#include "device/cost_model.h"

#include <algorithm>

#include "tensor/error.h"

namespace cubevec {

ModelledCost model_kernel(const DeviceProfile& profile, const KernelDesc& kernel) {
  ModelledCost cost;
  if (kernel.unit == Unit::comm) {  // bytes over the busiest link, one latency per transfer
    if (!profile.has_links)
      throw Error("device profile '" + profile.name + "' (" + profile.source + ") has no \"links\" figures, needed to model '" +
                  kernel.name + "'; add e.g. \"links\": {\"peer_gbps\": 56, \"peer_latency_us\": 10, \"host_gbps\": 50}");
    cost.memory_s = kernel.bytes / (profile.peer_gbps * 1e9) + profile.peer_latency_us * 1e-6;
    cost.total_s = cost.memory_s + profile.launch_overhead_us * 1e-6;
    return cost;
  }
  if (kernel.flops > 0) cost.compute_s = kernel.flops / (profile.peak_tflops(kernel.unit == Unit::cube, kernel.dtype) * 1e12);
  cost.memory_s = kernel.bytes / (profile.hbm_gbps * 1e9);
  cost.total_s = std::max(cost.compute_s, cost.memory_s) + profile.launch_overhead_us * 1e-6;
  return cost;
}

}  // namespace cubevec
