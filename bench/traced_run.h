// A model forward timed and then run once more with the device trace on: its measured time, the
// FLOPs its kernels declare, and the measured kernel time by kernel name (the per-op rows of the
// `blocks` and `text` suites).
#pragma once

#include <functional>
#include <map>
#include <string>

#include "bench/harness.h"
#include "device/device.h"

namespace cubevec::bench {

struct TracedRun {
  Timing timing;
  double flops = 0;
  std::map<std::string, double> op_s;  // measured kernel seconds by kernel name, one run
};

// Times `forward` (median of max(2, repeats / 2) runs after a warm-up), then runs it once traced.
// `device` must have been made with tracing on.
inline TracedRun measure_traced(Device& device, const std::function<Tensor()>& forward, int repeats) {
  TracedRun run;
  run.timing = time_runs([&] { forward().data_ptr(); }, std::max(2, repeats / 2));
  device.synchronize();
  device.trace().clear();
  forward().data_ptr();
  device.synchronize();
  for (const auto& r : device.trace().records()) {
    run.flops += r.desc.flops;
    run.op_s[r.desc.name] += r.real_end_s - r.real_start_s;
  }
  return run;
}

}  // namespace cubevec::bench
