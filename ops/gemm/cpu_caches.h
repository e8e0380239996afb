// The data cache sizes of the CPU the GEMM runs on, which set its cache blocking. Read from Linux's
// sysfs (what the kernel reports for cpu0, virtual machines included), else from CPUID, else
// conservative defaults; the source is recorded so reports can say where the figures came from.
#pragma once

#include <cstdint>
#include <string>

namespace cubevec::ops::gemm {

struct CpuCaches {
  int64_t l1d = 32 << 10, l2 = 1 << 20, l3 = 8 << 20;  // bytes per core (L1, L2) and shared (L3)
  std::string source = "defaults";                     // "sysfs", "cpuid" or "defaults"
  bool operator==(const CpuCaches& other) const { return l1d == other.l1d && l2 == other.l2 && l3 == other.l3; }
  std::string text() const;  // "L1d 48 KiB, L2 2048 KiB, L3 480 MiB (sysfs)"
};

// The caches listed under `dir` (sysfs layout: index*/level, type, size such as "48K"). Levels it
// does not list, or lists with values that do not parse, come from CPUID or the defaults.
CpuCaches read_cpu_caches(const std::string& dir);
// This machine's, from /sys/devices/system/cpu/cpu0/cache, read once.
const CpuCaches& this_cpu_caches();

// The CPU's brand string from CPUID ("Intel(R) Xeon(R) Processor"), trimmed; "unknown x86-64" when absent.
const std::string& cpu_model_name();

}  // namespace cubevec::ops::gemm
