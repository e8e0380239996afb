#include "cli/run_printing.h"

#include <cstdio>

namespace cubevec::cli {

std::function<void(const pipelines::Progress&)> progress_printer(bool simulate) {
  return [simulate](const pipelines::Progress& p) {
    std::string skipped;
    if (p.stages && !p.stages->empty() && !p.stages->step_counts().empty())
      skipped = "  " + pipelines::StageList::skipped_text(p.stages->step_counts().back());
    if (simulate)
      std::fprintf(stderr, "step %d/%d  modelled %.3f s/step%s\n", p.step, p.steps, p.timings->modelled_step_s.back(), skipped.c_str());
    else
      std::fprintf(stderr, "step %d/%d  %.2f s/step  ETA %.1f s%s\n", p.step, p.steps, p.seconds,
                   pipelines::mean(p.timings->step_s) * (p.steps - p.step), skipped.c_str());
  };
}

void print_stage_table(const std::vector<pipelines::StageTime>& stages, const pipelines::T2ITimings& timings, int steps,
                       const std::string& profile, const AllocatorStats& memory) {
  std::fprintf(stderr, "\n%-28s %10s\n", "stage", "seconds");
  for (const pipelines::StageTime& stage : stages) {
    if (stage.name == "denoising")
      std::fprintf(stderr, "%-28s %10.3f   (%.3f s/step mean over %d steps)\n", "denoising", stage.seconds, pipelines::mean(timings.step_s),
                   steps);
    else std::fprintf(stderr, "%-28s %10.3f\n", stage.name.c_str(), stage.seconds);
  }
  std::fprintf(stderr, "%-28s %10.3f   (%.3f s/step on the %s profile's modelled clock)\n", "modelled denoising",
               timings.modelled_denoise_s, pipelines::mean(timings.modelled_step_s), profile.c_str());
  std::fprintf(stderr, "peak memory (allocator): %s live, %s reserved; process peak resident set %s\n", mib(memory.peak_live_bytes).c_str(),
               mib(memory.peak_reserved_bytes).c_str(), mib(pipelines::peak_resident_bytes()).c_str());
}

void print_communication(const Device& device) {
  const DeviceStats stats = device.stats();
  const auto comm = static_cast<std::size_t>(Unit::comm);
  if (stats.kernels_per_unit[comm] == 0) return;
  std::fprintf(stderr, "%-28s %10.3f   (%llu collectives, %s over the busiest link; %.4f s modelled)\n", "communication",
               stats.measured_busy_s[comm], static_cast<unsigned long long>(stats.kernels_per_unit[comm]),
               mib(static_cast<std::size_t>(stats.bytes_per_unit[comm])).c_str(), stats.modelled_busy_s[comm]);
}

}  // namespace cubevec::cli
