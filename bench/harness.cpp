#include "bench/harness.h"

#include <algorithm>
#include <cstdio>

namespace cubevec::bench {

Timing summarize(std::vector<double> seconds) {
  Timing t;
  if (seconds.empty()) return t;
  std::sort(seconds.begin(), seconds.end());
  t.runs = static_cast<int>(seconds.size());
  t.min_s = seconds.front();
  t.max_s = seconds.back();
  const std::size_t n = seconds.size();
  t.median_s = n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
  return t;
}

Timing time_runs(const std::function<void()>& body, int runs, int warmup) {
  for (int i = 0; i < warmup; ++i) body();
  std::vector<double> seconds;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return summarize(seconds);
}

void Context::add(Result r) {
  std::fprintf(stderr, "%-10s %-34s %-22s %-5s %11.3f %11.3f %11.3f", r.suite.c_str(), r.case_name.c_str(), r.impl.c_str(), r.dtype.c_str(),
               r.timing.median_s * 1e3, r.timing.min_s * 1e3, r.timing.max_s * 1e3);
  // Integer products are operations, not floating-point ones.
  if (r.gflops > 0) std::fprintf(stderr, "  %9.1f %s", r.gflops, r.dtype == "i8" ? "GOP/s  " : "GFLOP/s");
  if (r.gbps > 0) std::fprintf(stderr, "  %9.2f GB/s", r.gbps);
  if (r.peak_fraction > 0) std::fprintf(stderr, "  %5.1f%% of peak", r.peak_fraction * 100);
  for (const auto& [key, value] : r.extra) std::fprintf(stderr, "  %s=%.3g", key.c_str(), value);
  std::fprintf(stderr, "\n");
  results.push_back(std::move(r));
}

}  // namespace cubevec::bench
