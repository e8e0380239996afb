// The figures a generation reports, as JSON: the stages' wall times, the per-step times on the
// wall clock and the device's modelled clock, the allocator's peaks per phase, the memory
// estimate, the acceleration stages' counts, the communication. The command line prints the same
// figures as a table (cli/run_printing.h).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/device.h"
#include "pipelines/generation.h"
#include "pipelines/memory_estimate.h"
#include "pipelines/stage.h"
#include "tensor/caching_allocator.h"

namespace cubevec::pipelines {

struct StageTime {
  std::string name;  // "load", "text encoding", ... (JSON key: lower case, spaces become underscores)
  double seconds = 0;
};

// {"peak_bytes", "weights_bytes", "packed_bytes", "denoising_bytes", "vae_decode_bytes"}.
nlohmann::ordered_json memory_estimate_json(const MemoryEstimate& estimate);

// The allocator's peak per phase: created right after denoising (it restarts the peak there),
// finish() after decoding gives the whole run's stats with the larger peak. The allocator is the
// process's: with two generations at once, each sees both.
class PhasePeaks {
 public:
  static PhasePeaks after_denoising();
  AllocatorStats finish();
  nlohmann::ordered_json json() const;  // {"denoising": bytes, "vae_decode": bytes}, live peaks

 private:
  std::size_t denoising_ = 0, denoising_reserved_ = 0, vae_decode_ = 0;
};

// Communication on this rank of a multi-device run: collectives, bytes over the busiest link, the
// seconds its thread spent in them and the modelled time; {} when there were none.
nlohmann::ordered_json communication_json(const Device& device);

// The FLOPs the device's kernels have declared so far, over all units (the run's GFLOP/s).
double declared_flops(const Device& device);

// The process's peak resident set so far (Linux VmHWM), bytes; 0 when unknown.
std::size_t peak_resident_bytes();

double mean(const std::vector<double>& values);

// stages_s, step_s, step_mean_s, modelled_*, peak_*.
nlohmann::ordered_json timing_json(const std::vector<StageTime>& stages, const T2ITimings& timings, const AllocatorStats& memory);

// {"stages": [{name, seconds, summary, settings}], "step_counts": [...]}: what each acceleration
// stage did and what it skipped per step.
nlohmann::ordered_json stage_report_json(const StageList& stages);

}  // namespace cubevec::pipelines
