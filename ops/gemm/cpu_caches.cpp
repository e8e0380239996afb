#include "ops/gemm/cpu_caches.h"

#include <cpuid.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

namespace cubevec::ops::gemm {

namespace {

std::optional<std::string> read_line(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ' || line.back() == '\r')) line.pop_back();
  return line;
}

// "48K", "2048K", "32M", "1048576": bytes, or nullopt for anything else (or an absurd size).
std::optional<int64_t> parse_size(const std::string& text) {
  if (text.empty() || text.size() > 12) return std::nullopt;
  int64_t value = 0;
  std::size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) value = value * 10 + (text[i] - '0');
  if (i == 0) return std::nullopt;
  int64_t unit = 1;
  if (i + 1 == text.size() && (text[i] == 'K' || text[i] == 'k')) unit = 1 << 10;
  else if (i + 1 == text.size() && (text[i] == 'M' || text[i] == 'm')) unit = 1 << 20;
  else if (i != text.size()) return std::nullopt;
  value *= unit;
  if (value < 1024 || value > (int64_t{1} << 36)) return std::nullopt;
  return value;
}

// CPUID leaf 4 (Intel) or 0x8000001D (AMD): deterministic cache parameters.
void read_cpuid_caches(CpuCaches& caches, bool& found) {
  unsigned max_basic = 0, ebx = 0, ecx = 0, edx = 0, max_ext = 0;
  __get_cpuid(0, &max_basic, &ebx, &ecx, &edx);
  __get_cpuid(0x80000000, &max_ext, &ebx, &ecx, &edx);
  const unsigned leaf = max_basic >= 4 ? 4u : max_ext >= 0x8000001D ? 0x8000001Du : 0u;
  if (leaf == 0) return;
  for (unsigned sub = 0; sub < 16; ++sub) {
    unsigned eax = 0;
    if (!__get_cpuid_count(leaf, sub, &eax, &ebx, &ecx, &edx)) return;
    const unsigned type = eax & 31, level = (eax >> 5) & 7;
    if (type == 0) break;
    if (type == 2) continue;  // instruction cache
    const int64_t bytes = int64_t{(ebx >> 22) + 1} * (((ebx >> 12) & 1023) + 1) * ((ebx & 4095) + 1) * (int64_t{ecx} + 1);
    if (level == 1) caches.l1d = bytes;
    else if (level == 2) caches.l2 = bytes;
    else if (level == 3) caches.l3 = bytes;
    else continue;
    found = true;
  }
}

}  // namespace

std::string CpuCaches::text() const {
  const auto size = [](int64_t bytes) {
    return bytes % (1 << 20) == 0 && bytes >= (8 << 20) ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
  };
  return "L1d " + size(l1d) + ", L2 " + size(l2) + ", L3 " + size(l3) + " (" + source + ")";
}

CpuCaches read_cpu_caches(const std::string& dir) {
  CpuCaches caches;
  bool from_cpuid = false;
  read_cpuid_caches(caches, from_cpuid);
  if (from_cpuid) caches.source = "cpuid";
  bool from_sysfs = false;
  std::error_code ec;
  for (int index = 0; index < 16; ++index) {
    const std::filesystem::path entry = std::filesystem::path(dir) / ("index" + std::to_string(index));
    if (!std::filesystem::is_directory(entry, ec)) continue;
    const auto level = read_line(entry / "level"), type = read_line(entry / "type"), size_text = read_line(entry / "size");
    if (!level || !type || !size_text || *type == "Instruction") continue;
    const auto bytes = parse_size(*size_text);
    if (!bytes) continue;
    if (*level == "1") caches.l1d = *bytes;
    else if (*level == "2") caches.l2 = *bytes;
    else if (*level == "3") caches.l3 = *bytes;
    else continue;
    from_sysfs = true;
  }
  if (from_sysfs) caches.source = "sysfs";
  return caches;
}

const CpuCaches& this_cpu_caches() {
  // Leaked on purpose: GEMMs read it from the default device's threads, which outlive main().
  static const CpuCaches* caches = new CpuCaches(read_cpu_caches("/sys/devices/system/cpu/cpu0/cache"));
  return *caches;
}

const std::string& cpu_model_name() {
  // Leaked on purpose, as this_cpu_caches(): the tuner reads it from threads that outlive main().
  static const std::string* name = new std::string([] {
    unsigned max_ext = 0, ebx = 0, ecx = 0, edx = 0;
    __get_cpuid(0x80000000, &max_ext, &ebx, &ecx, &edx);
    if (max_ext < 0x80000004) return std::string("unknown x86-64");
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      unsigned regs[4] = {};
      __get_cpuid(0x80000002 + i, &regs[0], &regs[1], &regs[2], &regs[3]);
      std::memcpy(brand + 16 * i, regs, 16);
    }
    std::string text(brand);
    const auto first = text.find_first_not_of(' ');
    if (first == std::string::npos) return std::string("unknown x86-64");
    text = text.substr(first, text.find_last_not_of(' ') - first + 1);
    return text;
  }());
  return *name;
}

}  // namespace cubevec::ops::gemm
