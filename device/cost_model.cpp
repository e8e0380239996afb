#include "device/cost_model.h"

#include <algorithm>

namespace cubevec {

ModelledCost model_kernel(const DeviceProfile& profile, const KernelDesc& kernel) {
  ModelledCost cost;
  if (kernel.flops > 0) cost.compute_s = kernel.flops / (profile.peak_tflops(kernel.unit == Unit::cube, kernel.dtype) * 1e12);
  cost.memory_s = kernel.bytes / (profile.hbm_gbps * 1e9);
  cost.total_s = std::max(cost.compute_s, cost.memory_s) + profile.launch_overhead_us * 1e-6;
  return cost;
}

}  // namespace cubevec
