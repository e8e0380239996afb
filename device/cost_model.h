// The cost model of the emulated NPU: how long a kernel would take there.
// time = max(compute, bytes / HBM bandwidth) + launch overhead; for a communication kernel, bytes
// over its busiest link / peer bandwidth + link latency + launch overhead (a host-link copy: bytes /
// host_gbps + launch overhead).
//
// compute, with the profile's "kernels" figures (otherwise every efficiency is 1):
//  - Cube: FLOPs / (peak for the dtype x class efficiency x tile efficiency). The class efficiency
//    is cube_efficiency for GEMMs and convolutions, attention_efficiency for attention (by its key
//    length when the profile has "attention_keys": DeviceProfile::attention_efficiency_at). The tile
//    efficiency counts the padding of the last tile and the idle cores of the last wave: a kernel's
//    `batches` x ceil(m / tile_m) x ceil(n / tile_n) tiles run in waves of ai_cores, so
//    useful work / (waves x ai_cores x tile area).
//  - attention is a mixed kernel: its online softmax (attention_vector_ops per score) runs on
//    the Vector cores beside the Cube's matmuls; it takes the longer of the two.
//  - Vector: FLOPs / (peak for the dtype x vector_efficiency).
// The host issue clock (host_issue_us per kernel and stream) is applied by the stream; the device's
// timeline shares the HBM: with the "kernels" figures, a Cube or Vector kernel that starts while
// the other unit is still busy gets half the bandwidth (the earlier kernel keeps its price).
#pragma once

#include "device/device_profile.h"
#include "device/kernel.h"

namespace cubevec {

struct ModelledCost {
  double compute_s = 0;
  double memory_s = 0;
  double total_s = 0;  // max(compute, memory) + launch overhead
  double launch_s = 0;

  // The time with the HBM bandwidth shared `ways` ways (kernels overlapping on the Cube and Vector units).
  double with_shared_hbm(int ways) const;
};

ModelledCost model_kernel(const DeviceProfile& profile, const KernelDesc& kernel);

// The tile efficiency above, in (0, 1]; 1 without tile figures or without the kernel's work.
double tile_efficiency(const DeviceProfile& profile, const KernelDesc::CubeWork& work);

}  // namespace cubevec
