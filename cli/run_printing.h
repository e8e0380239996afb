// What a generation command prints on stderr: per-step progress (s/step and ETA, or the modelled
// s/step in simulate mode, with what the stages skipped), the per-stage timing table with the
// modelled denoising time and the peak memory, and the communication row of a multi-device run.
// The same figures as JSON: pipelines/run_report.h.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "device/device.h"
#include "pipelines/pipeline.h"
#include "pipelines/run_report.h"
#include "tensor/caching_allocator.h"

namespace cubevec::cli {

// "step i/N  x s/step  ETA y s" after each step.
std::function<void(const pipelines::Progress&)> progress_printer(bool simulate);

// The table: the stages in order (denoising with its per-step mean), the modelled denoising time
// on `profile`'s clock, the peak memory.
void print_stage_table(const std::vector<pipelines::StageTime>& stages, const pipelines::T2ITimings& timings, int steps,
                       const std::string& profile, const AllocatorStats& memory);

// The communication unit's row (nothing when there were no collectives).
void print_communication(const Device& device);

}  // namespace cubevec::cli
