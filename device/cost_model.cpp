#include "device/cost_model.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "tensor/shape.h"

namespace cubevec {

ModelledCost model_kernel(const DeviceProfile& profile, const KernelDesc& kernel) {
  ModelledCost cost;
  if (kernel.unit == Unit::comm) {  // bytes over the busiest link, one latency per transfer
    if (!profile.has_links)
      throw Error("device profile '" + profile.name + "' (" + profile.source + ") has no \"links\" figures, needed to model '" +
                  kernel.name + "'; add e.g. \"links\": {\"peer_gbps\": 56, \"peer_latency_us\": 10, \"host_gbps\": 50}");
    cost.memory_s = kernel.link == KernelDesc::Link::host ? kernel.bytes / (profile.host_gbps * 1e9)
                                                          : kernel.bytes / (profile.peer_gbps * 1e9) + profile.peer_latency_us * 1e-6;
    cost.launch_s = profile.launch_overhead_us * 1e-6;
    cost.total_s = cost.memory_s + cost.launch_s;
    return cost;
  }
  const bool cube = kernel.unit == Unit::cube;
  if (kernel.flops > 0) {
    const double efficiency = !cube ? profile.vector_efficiency
                                    : (kernel.scores > 0 ? profile.attention_efficiency_at(kernel.key_length) : profile.cube_efficiency) *
                                          tile_efficiency(profile, kernel.cube_work);
    cost.compute_s = kernel.flops / (profile.peak_tflops(cube, kernel.dtype) * 1e12 * efficiency);
  }
  if (cube && kernel.scores > 0 && profile.attention_vector_ops > 0) {
    const double softmax_s =
        kernel.scores * profile.attention_vector_ops / (profile.peak_tflops(false, kernel.dtype) * 1e12 * profile.vector_efficiency);
    cost.compute_s = std::max(cost.compute_s, softmax_s);
  }
  cost.memory_s = kernel.bytes / (profile.hbm_gbps * 1e9);
  cost.launch_s = profile.launch_overhead_us * 1e-6;
  cost.total_s = std::max(cost.compute_s, cost.memory_s) + cost.launch_s;
  return cost;
}

double ModelledCost::with_shared_hbm(int ways) const { return std::max(compute_s, memory_s * ways) + launch_s; }

double tile_efficiency(const DeviceProfile& profile, const KernelDesc::CubeWork& work) {
  if (profile.cube_tile_m < 1 || work.batches < 1 || work.m < 1) return 1.0;
  const int64_t tile_n = work.n > 0 ? profile.cube_tile_n : 1, n = std::max<int64_t>(work.n, 1);
  const double tiles = static_cast<double>(work.batches) * static_cast<double>(ceil_div(work.m, profile.cube_tile_m)) *
                       static_cast<double>(ceil_div(n, tile_n));
  const double waves = std::ceil(tiles / profile.ai_cores);
  return static_cast<double>(work.batches) * static_cast<double>(work.m) * static_cast<double>(n) /
         (waves * profile.ai_cores * static_cast<double>(profile.cube_tile_m) * static_cast<double>(tile_n));
}

}  // namespace cubevec
