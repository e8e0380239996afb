// What every kernel launch declares: its name, the unit it runs on, and the work it does, which
// the trace shows and the cost model turns into modelled NPU time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "device/unit.h"
#include "tensor/dtype.h"

namespace cubevec {

struct KernelDesc {
  std::string name;
  Unit unit = Unit::vector;
  double flops = 0;          // floating-point (or integer multiply-add) operations
  double bytes = 0;          // bytes read plus bytes written in device memory; for a comm-unit
                             // kernel, the bytes sent over the busiest link to another card
  DType dtype = DType::f32;  // the compute dtype, which picks the unit's modelled peak
  // A Cube kernel's output tiles, for the cost model's tile and wave quantization: `batches`
  // independent m x n outputs (n = 0: only the rows are tiled, as attention's query blocks).
  // Zeros: unknown (no quantization).
  struct CubeWork {
    int64_t batches = 0, m = 0, n = 0;
  } cube_work{};
  double scores = 0;  // attention: score elements, whose softmax runs on the Vector cores (a mixed kernel)
  // Attention: the keys each query attends to (the kernel's inner loop), which its modelled
  // efficiency depends on (DeviceProfile::attention_keys); 0: unknown (no length dependence).
  int64_t key_length = 0;
  // A comm-unit kernel's link: to another card (peer_gbps + peer_latency_us) or to the host
  // (host_gbps: weight streaming's host-to-device copies).
  enum class Link : uint8_t { peer, host };
  Link link = Link::peer;
};

// The kernel's work. Runs on a thread of the declared unit; tbb::parallel_for inside it uses that
// unit's threads. It must reach tensor data through unsynchronized_data_ptr(): the device has
// already ordered it after the work it depends on.
using KernelBody = std::function<void()>;

}  // namespace cubevec
