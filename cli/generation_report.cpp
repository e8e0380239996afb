#include "cli/output_flag.h"
#include "cli/generation_report.h"
#include "cli/range_flag.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "device/trace.h"
#include "tensor/error.h"
#include "tensor/output_file.h"

namespace cubevec::cli {

DType GenerationFlags::weight_dtype() const {
  const DType d = parse_dtype(dtype);
  if (d != DType::f32 && d != DType::bf16) throw Error("--dtype must be f32 or bf16, got " + dtype);
  return d;
}

DeviceProfile GenerationFlags::profile(const DeviceFlags& device_flags) const {
  DeviceFlags resolved = device_flags;
  if (threads > 0 && resolved.cube_threads <= 0) resolved.cube_threads = threads;
  return resolved.resolve();
}

void add_generation_flags(CLI::App& command, GenerationFlags& flags) {
  command.add_option("--dtype", flags.dtype, "Transformer precision: f32, or bf16 (bf16 weights and activations, f32 accumulation)");
  command.add_option("--variant", flags.variant, "Read diffusion_pytorch_model.<variant>.safetensors (e.g. fp16, bf16)");
  command.add_option("--threads", flags.threads, "Cube-unit threads (same as --cube-threads)")->check(in_range(1, 4096));
  command.add_flag("--simulate", flags.simulate, "Shape-only run on the device profile's modelled clock (reads config files only)");
  command.add_flag("--check-weights", flags.check_weights, "Check that every loaded weight is finite (one more pass over them)");
  command
      .add_option("--memory-limit", flags.memory_limit,
                  "Refuse a request whose estimated peak memory is above this size (e.g. 16G; default: the memory available)")
      ->check(CLI::Validator(
          [](const std::string& text) {
            try {  // CLI11 wants the message returned: an exception here would end the process
              pipelines::parse_memory_size(text, "");  // CLI11 puts the flag's name first
              return std::string();
            } catch (const Error& e) {
              return std::string(e.what());
            }
          },
          "SIZE"));
  command.add_option("--json", flags.json_path, "Write the timings as JSON to this file")->check(output_file_path());
  command.add_option("--trace", flags.trace_path, "Write a Chrome trace of every kernel to this file")->check(output_file_path());
}

void write_outputs(const GenerationFlags& flags, const std::string& label, Device& device, const nlohmann::ordered_json& json) {
  if (!flags.trace_path.empty()) {
    write_chrome_trace(flags.trace_path, {{label, device.trace().records()}});
    std::fprintf(stderr, "trace written to %s\n", flags.trace_path.c_str());
  }
  if (!flags.json_path.empty()) {
    write_output_file(flags.json_path, "--json", json.dump(2) + "\n");
  }
}

void require_memory(const GenerationFlags& flags, const pipelines::MemoryEstimate& estimate) {
  if (!flags.memory_limit.empty()) {
    const uint64_t limit = pipelines::parse_memory_size(flags.memory_limit, "--memory-limit");
    pipelines::require_fits(estimate, limit, "--memory-limit " + flags.memory_limit);
    default_allocator().set_memory_limit(limit);
    return;
  }
  // A simulated run allocates nothing: only an explicit limit (a device's memory) applies to it.
  if (!flags.simulate)
    pipelines::require_fits(estimate, pipelines::available_memory_bytes(), "the memory available now (give --memory-limit to set another)");
}

nlohmann::ordered_json memory_estimate_json(const pipelines::MemoryEstimate& e) {
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

void check_weights(const GenerationFlags& flags, const std::string& model_dir, const models::ParameterTable& transformer,
                   const models::ParameterTable* vae) {
  if (!flags.check_weights || flags.simulate) return;
  models::require_finite_parameters(transformer, model_dir + "/transformer");
  if (vae) models::require_finite_parameters(*vae, model_dir + "/vae");
}

double mean(const std::vector<double>& values) {
  double sum = 0;
  for (double x : values) sum += x;
  return values.empty() ? 0.0 : sum / static_cast<double>(values.size());
}

std::string mib(std::size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

pipelines::StepCallback progress_printer(const pipelines::T2ITimings& timings, bool simulate, const pipelines::StageList* stages) {
  return [&timings, simulate, stages](int step, int steps, double seconds) {
    std::string skipped;
    if (stages && !stages->empty() && !stages->step_counts().empty())
      skipped = "  " + pipelines::StageList::skipped_text(stages->step_counts().back());
    if (simulate)
      std::fprintf(stderr, "step %d/%d  modelled %.3f s/step%s\n", step, steps, timings.modelled_step_s.back(), skipped.c_str());
    else
      std::fprintf(stderr, "step %d/%d  %.2f s/step  ETA %.1f s%s\n", step, steps, seconds, mean(timings.step_s) * (steps - step),
                   skipped.c_str());
  };
}

void print_stage_table(const std::vector<StageTime>& stages, const pipelines::T2ITimings& timings, int steps,
                       const std::string& profile, const AllocatorStats& memory) {
  std::fprintf(stderr, "\n%-28s %10s\n", "stage", "seconds");
  for (const StageTime& stage : stages) {
    if (stage.name == "denoising")
      std::fprintf(stderr, "%-28s %10.3f   (%.3f s/step mean over %d steps)\n", "denoising", stage.seconds, mean(timings.step_s), steps);
    else
      std::fprintf(stderr, "%-28s %10.3f\n", stage.name.c_str(), stage.seconds);
  }
  std::fprintf(stderr, "%-28s %10.3f   (%.3f s/step on the %s profile's modelled clock)\n", "modelled denoising",
               timings.modelled_denoise_s, mean(timings.modelled_step_s), profile.c_str());
  std::fprintf(stderr, "peak memory (allocator): %s live, %s reserved; process peak resident set %s\n", mib(memory.peak_live_bytes).c_str(),
               mib(memory.peak_reserved_bytes).c_str(), mib(peak_resident_bytes()).c_str());
}

void print_communication(const Device& device) {
  const DeviceStats stats = device.stats();
  const auto comm = static_cast<std::size_t>(Unit::comm);
  if (stats.kernels_per_unit[comm] == 0) return;
  std::fprintf(stderr, "%-28s %10.3f   (%llu collectives, %s over the busiest link; %.4f s modelled)\n", "communication",
               stats.measured_busy_s[comm], static_cast<unsigned long long>(stats.kernels_per_unit[comm]),
               mib(static_cast<std::size_t>(stats.bytes_per_unit[comm])).c_str(), stats.modelled_busy_s[comm]);
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

nlohmann::ordered_json timing_json(const std::vector<StageTime>& stages, const pipelines::T2ITimings& timings,
                                   const AllocatorStats& memory) {
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

}  // namespace cubevec::cli
