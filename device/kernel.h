// What every kernel launch declares: its name, the unit it runs on, and the work it does, which
// the trace shows and the cost model turns into modelled NPU time.
#pragma once

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
};

// The kernel's work. Runs on a thread of the declared unit; tbb::parallel_for inside it uses that
// unit's threads. It must reach tensor data through unsynchronized_data_ptr(): the device has
// already ordered it after the work it depends on.
using KernelBody = std::function<void()>;

}  // namespace cubevec
