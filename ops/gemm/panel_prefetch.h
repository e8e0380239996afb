// Prefetching the next packed B micro-panel into L2 while the micro-kernel sweeps the current one
// over the A block. The first call on a panel otherwise streams it from L3 (a packed B is larger
// than L2) at a fraction of the FMA rate; spread over the calls, the prefetches cost a few loads
// each. Measured on a 2-vCPU Zen 3 (AVX2, medians of 7-9 in turns): f32 GEMM +4-9% on four of the
// five bench shapes, 1024^3 unchanged.
#pragma once

#include <algorithm>
#include <cstdint>

namespace cubevec::ops::gemm {

class NextPanelPrefetch {
 public:
  // `next`: the panel after the current one (nullptr: none); `calls`: micro-kernel calls on the
  // current one, over which the prefetches are spread.
  NextPanelPrefetch(const void* next, int64_t bytes, int64_t calls)
      : next_(static_cast<const char*>(next)),
        lines_(next ? (bytes + kLine - 1) / kLine : 0),
        per_call_((lines_ + std::max<int64_t>(calls, 1) - 1) / std::max<int64_t>(calls, 1)) {}

  // Before each micro-kernel call.
  void step() {
    const int64_t end = std::min(lines_, line_ + per_call_);
    for (; line_ < end; ++line_) __builtin_prefetch(next_ + line_ * kLine, 0, 2);  // the T1 hint: L2 (CPUs differ in what they do with it)
  }

 private:
  static constexpr int64_t kLine = 64;
  const char* next_;
  int64_t lines_, per_call_, line_ = 0;
};

}  // namespace cubevec::ops::gemm
