// What t2i and t2v print while and after they generate: per-step progress (s/step and ETA, or the
// modelled s/step in simulate mode), the per-stage timing table with the modelled denoising time
// and the allocator's peak memory, and the same figures for --json.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipelines/flux_t2i.h"
#include "tensor/caching_allocator.h"

namespace cubevec::cli {

struct StageTime {
  std::string name;  // "load", "text encoding", ... (JSON key: lower case, spaces become underscores)
  double seconds = 0;
};

// Prints "step i/N  x s/step  ETA y s" (or the modelled figure) on stderr after each step.
pipelines::StepCallback progress_printer(const pipelines::T2ITimings& timings, bool simulate);

double mean(const std::vector<double>& values);

// The table on stderr: the stages in order (denoising with its per-step mean after the stage
// named "denoising"), the modelled denoising time on `profile`'s clock, the peak memory.
void print_stage_table(const std::vector<StageTime>& stages, const pipelines::T2ITimings& timings, int steps,
                       const std::string& profile, const AllocatorStats& memory);

// The JSON figures shared by both commands: stages_s, step_s, step_mean_s, modelled_*, peak_*.
nlohmann::ordered_json timing_json(const std::vector<StageTime>& stages, const pipelines::T2ITimings& timings,
                                   const AllocatorStats& memory);

// "12.3 MiB"
std::string mib(std::size_t bytes);

}  // namespace cubevec::cli
