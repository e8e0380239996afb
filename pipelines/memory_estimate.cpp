#include "pipelines/memory_estimate.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <set>
#include <stdexcept>

#include "models/layers.h"
#include "ops/gemm/tuner.h"
#include "tensor/caching_allocator.h"
#include "base/error.h"

namespace cubevec::pipelines {

uint64_t stored_bytes(const models::ParameterTable& table, DType dtype) {
  uint64_t bytes = 0;
  for (const models::ParameterSpec& spec : table.specs()) {
    const bool narrow = dtype == DType::bf16 && spec.shape.size() >= 2 && !spec.keep_f32;
    bytes += static_cast<uint64_t>(shape_numel(spec.shape)) * (narrow ? 2 : 4);
  }
  return bytes;
}

TransformerBytes transformer_bytes(const models::ParameterTable& table, const std::vector<std::string>& modules, DType dtype, int offload,
                                   int cube_threads) {
  const auto block_of = [&](const std::string& name) {
    for (std::size_t b = 0; b < modules.size(); ++b)
      if (name.compare(0, modules[b].size() + 1, modules[b] + ".") == 0) return static_cast<int>(b);
    return -1;
  };
  const ops::gemm::Isa isa = ops::gemm::best_isa();
  const ops::gemm::Bf16Path path = ops::gemm::expected_bf16_path(isa, cube_threads);
  TransformerBytes outside;
  std::vector<TransformerBytes> blocks(modules.size());
  std::set<std::string> kept_f32;
  for (const models::ParameterSpec& spec : table.specs()) {
    if (spec.keep_f32) kept_f32.insert(spec.name);
    const bool narrow = dtype == DType::bf16 && spec.shape.size() >= 2 && !spec.keep_f32;
    const int block = block_of(spec.name);
    (block < 0 ? outside : blocks[static_cast<std::size_t>(block)]).weights +=
        static_cast<uint64_t>(shape_numel(spec.shape)) * (narrow ? 2 : 4);
  }
  for (const auto& [name, linear] : table.linears()) {
    const bool bf16 = dtype == DType::bf16 && !kept_f32.count(name + ".weight");
    const uint64_t bytes = ops::gemm::packed_b_bytes(linear->out, linear->in, bf16 ? ops::gemm::Element::bf16 : ops::gemm::Element::f32,
                                                     isa, bf16 ? path : ops::gemm::Bf16Path::f32);
    const int block = block_of(name);
    (block < 0 ? outside : blocks[static_cast<std::size_t>(block)]).packed += bytes;
  }
  TransformerBytes total = outside;
  if (offload <= 0) {
    for (const auto& b : blocks) total.weights += b.weights, total.packed += b.packed;
    return total;
  }
  // The largest blocks stand in for the ones in memory at once.
  std::sort(blocks.begin(), blocks.end(),
            [](const TransformerBytes& x, const TransformerBytes& y) { return x.weights + x.packed > y.weights + y.packed; });
  const std::size_t window = std::min<std::size_t>(blocks.size(), 2 * static_cast<std::size_t>(offload) + 2);
  for (std::size_t i = 0; i < window; ++i) total.weights += blocks[i].weights, total.packed += blocks[i].packed;
  return total;
}

uint64_t activation_bytes(DType activations) { return activations == DType::bf16 ? 2 : 4; }

std::string MemoryEstimate::describe() const {
  return human_bytes(peak()) + " (weights " + human_bytes(weights) + " + packed GEMM panels " + human_bytes(packed) +
         " + the larger of denoising " + human_bytes(denoising) + " and VAE decode " + human_bytes(vae_decode) + ")";
}

uint64_t available_memory_bytes() {
  uint64_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    uint64_t kib = 0;
    meminfo >> kib;
    meminfo.ignore(64, '\n');
    if (key == "MemAvailable:") available = kib * 1024;
  }
  // A cgroup v2 limit (containers, systemd slices) binds before the machine's free memory does.
  uint64_t max = 0, current = 0;
  std::ifstream max_file("/sys/fs/cgroup/memory.max"), current_file("/sys/fs/cgroup/memory.current");
  if ((max_file >> max) && (current_file >> current) && max > current) {
    const uint64_t cgroup = max - current;
    available = available == 0 ? cgroup : std::min(available, cgroup);
  }
  return available;
}

uint64_t parse_memory_size(const std::string& text, const std::string& flag) {
  const auto fail = [&] {
    throw Error((flag.empty() ? "" : flag + " ") + "'" + text +
                "': expected a size in bytes with an optional K, M, G or T suffix (powers of 1024), e.g. 24G or 512MiB");
  };
  // Decimal digits with at most one point, then the suffix: no sign, "inf", hex or exponents.
  const std::size_t number_end = std::min(text.find_first_not_of("0123456789."), text.size());
  const std::string number = text.substr(0, number_end);
  if (number.empty() || !std::isdigit(static_cast<unsigned char>(number[0])) || number.find('.') != number.rfind('.')) fail();
  double value = 0;
  try {
    value = std::stod(number);
  } catch (const std::out_of_range&) {  // hundreds of digits
    fail();
  }
  std::string suffix = text.substr(number_end);
  for (char& ch : suffix) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (suffix.size() == 3 && suffix.substr(1) == "IB") suffix = suffix.substr(0, 1);
  else if (suffix.size() == 2 && suffix[1] == 'B') suffix = suffix.substr(0, 1);
  const std::string units = "KMGT";
  double scale = 1;
  if (suffix == "B") suffix.clear();
  if (!suffix.empty()) {
    const std::size_t at = units.find(suffix);
    if (suffix.size() != 1 || at == std::string::npos) fail();
    scale = std::pow(1024.0, static_cast<double>(at + 1));
  }
  const double bytes = value * scale;
  if (!std::isfinite(bytes) || bytes < 1 || bytes >= 18446744073709551615.0) fail();
  return static_cast<uint64_t>(bytes);
}

void require_fits(const MemoryEstimate& estimate, uint64_t limit_bytes, const std::string& limit_source) {
  if (limit_bytes == 0 || estimate.peak() <= limit_bytes) return;
  throw Error("this request needs an estimated " + estimate.describe() + ", above " + limit_source + " of " + human_bytes(limit_bytes) +
              " (a smaller size, fewer frames, --dtype bf16 or --cfg off need less)");
}

}  // namespace cubevec::pipelines
