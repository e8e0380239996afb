#include "pipelines/run_report.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>

namespace cubevec::pipelines {

nlohmann::ordered_json memory_estimate_json(const MemoryEstimate& e) {
  return {{"peak_bytes", e.peak()},
          {"weights_bytes", e.weights},
          {"packed_bytes", e.packed},
          {"denoising_bytes", e.denoising},
          {"vae_decode_bytes", e.vae_decode}};
}

PhasePeaks PhasePeaks::after_denoising() {
  const AllocatorStats stats = default_allocator().stats();
  PhasePeaks p;
  p.denoising_ = stats.peak_live_bytes;
  p.denoising_reserved_ = stats.peak_reserved_bytes;
  default_allocator().reset_peak_stats();
  return p;
}

AllocatorStats PhasePeaks::finish() {
  AllocatorStats stats = default_allocator().stats();
  vae_decode_ = stats.peak_live_bytes;
  stats.peak_live_bytes = std::max(stats.peak_live_bytes, denoising_);
  stats.peak_reserved_bytes = std::max(stats.peak_reserved_bytes, denoising_reserved_);
  return stats;
}

nlohmann::ordered_json PhasePeaks::json() const { return {{"denoising", denoising_}, {"vae_decode", vae_decode_}}; }

double mean(const std::vector<double>& values) {
  double sum = 0;
  for (double x : values) sum += x;
  return values.empty() ? 0.0 : sum / static_cast<double>(values.size());
}

nlohmann::ordered_json communication_json(const Device& device) {
  const DeviceStats stats = device.stats();
  const auto comm = static_cast<std::size_t>(Unit::comm);
  if (stats.kernels_per_unit[comm] == 0) return nlohmann::ordered_json::object();
  return {{"collectives", stats.kernels_per_unit[comm]},
          {"link_bytes", stats.bytes_per_unit[comm]},
          {"measured_s", stats.measured_busy_s[comm]},
          {"modelled_s", stats.modelled_busy_s[comm]}};
}

std::size_t peak_resident_bytes() {
  // VmHWM belongs to this process's address space (getrusage's ru_maxrss would also count the
  // image of a parent that forked it before exec).
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return static_cast<std::size_t>(std::strtoull(line.c_str() + 6, nullptr, 10)) * 1024;
  return 0;
}

double declared_flops(const Device& device) {
  double total = 0;
  for (const double f : device.stats().flops_per_unit) total += f;
  return total;
}

nlohmann::ordered_json timing_json(const std::vector<StageTime>& stages, const T2ITimings& timings, const AllocatorStats& memory) {
  nlohmann::ordered_json stage_json = nlohmann::ordered_json::object();
  for (const StageTime& stage : stages) {
    std::string key = stage.name;
    for (char& ch : key) ch = ch == ' ' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    stage_json[key] = stage.seconds;
  }
  return {{"stages_s", stage_json},
          {"step_s", timings.step_s},
          {"step_mean_s", mean(timings.step_s)},
          {"modelled_denoising_s", timings.modelled_denoise_s},
          {"modelled_step_s", timings.modelled_step_s},
          {"modelled_step_mean_s", mean(timings.modelled_step_s)},
          {"peak_live_bytes", memory.peak_live_bytes},
          {"peak_reserved_bytes", memory.peak_reserved_bytes},
          {"peak_resident_bytes", peak_resident_bytes()}};
}

nlohmann::ordered_json stage_report_json(const StageList& stages) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < stages.stages().size(); ++i) {
    const auto& stage = stages.stages()[i];
    list.push_back(
        {{"name", stage->name()}, {"seconds", stages.stage_seconds(i)}, {"summary", stage->summary()}, {"settings", stage->report()}});
  }
  nlohmann::ordered_json per_step = nlohmann::ordered_json::array();
  for (const auto& c : stages.step_counts())
    per_step.push_back({{"block_calls", c.block_calls},
                        {"blocks_computed", c.blocks_computed},
                        {"blocks_skipped", c.block_calls - c.blocks_computed},
                        {"attention_calls", c.attention_calls},
                        {"attention_computed", c.attention_computed},
                        {"attention_skipped", c.attention_calls - c.attention_computed}});
  return {{"stages", list}, {"step_counts", per_step}};
}

}  // namespace cubevec::pipelines
