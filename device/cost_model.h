// The cost model of the emulated NPU: how long a kernel would take there.
// time = max(FLOPs / unit peak for the dtype, bytes / HBM bandwidth) + launch overhead; for a
// communication kernel, bytes over its busiest link / peer bandwidth + link latency + launch overhead.
#pragma once

#include "device/device_profile.h"
#include "device/kernel.h"

namespace cubevec {

struct ModelledCost {
  double compute_s = 0;
  double memory_s = 0;
  double total_s = 0;  // max(compute, memory) + launch overhead
};

ModelledCost model_kernel(const DeviceProfile& profile, const KernelDesc& kernel);

}  // namespace cubevec
