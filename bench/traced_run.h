// A model forward timed and then run once more with the device trace on: its measured time, the
// FLOPs its kernels declare, and the measured kernel time by kernel name (the per-op rows of the
// `blocks` and `text` suites).
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench/harness.h"
#include "device/device.h"

namespace cubevec::bench {

struct TracedRun {
  Timing timing;
  double flops = 0;
  std::map<std::string, double> op_s;  // measured kernel seconds by kernel name, one run
  double traced_s = 0;                 // the traced run's wall time
  double busy_s = 0;                   // of it, the time some kernel ran (the units' kernels may overlap)
};

// Times `forward` (median of max(2, repeats / 2) runs after a warm-up), then runs it once traced.
// `device` must have been made with tracing on.
inline TracedRun measure_traced(Device& device, const std::function<Tensor()>& forward, int repeats) {
  TracedRun run;
  run.timing = time_runs([&] { forward().data_ptr(); }, std::max(2, repeats / 2));
  device.synchronize();
  device.trace().clear();
  const auto start = std::chrono::steady_clock::now();
  forward().data_ptr();
  device.synchronize();
  run.traced_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<std::pair<double, double>> intervals;
  for (const auto& r : device.trace().records()) {
    run.flops += r.desc.flops;
    run.op_s[r.desc.name] += r.real_end_s - r.real_start_s;
    if (r.real_start_s >= 0) intervals.push_back({r.real_start_s, r.real_end_s});
  }
  std::sort(intervals.begin(), intervals.end());
  double covered_until = -1e300;
  for (const auto& [begin, end] : intervals) {
    run.busy_s += std::max(0.0, end - std::max(begin, covered_until));
    covered_until = std::max(covered_until, end);
  }
  return run;
}

}  // namespace cubevec::bench
