// Wall-clock seconds since a steady_clock time point: the pipelines' and stages' timings.
#pragma once

#include <chrono>

namespace cubevec::pipelines {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace cubevec::pipelines
