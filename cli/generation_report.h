// What t2i and t2v share: the flags --dtype, --threads, --simulate, --json and --trace; per-step
// progress (s/step and ETA, or the modelled s/step in simulate mode); the per-stage timing table
// with the modelled denoising time and the allocator's peak memory; the same figures for --json.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "device/device.h"
#include "cli/device_flags.h"
#include "pipelines/generation.h"
#include "pipelines/memory_estimate.h"
#include "models/parameters.h"
#include "tensor/caching_allocator.h"

namespace cubevec::cli {

struct GenerationFlags {
  std::string dtype = "f32", json_path, trace_path, variant;
  int threads = 0;
  bool simulate = false;
  bool check_weights = false;  // --check-weights: every loaded weight must be finite
  std::string memory_limit;    // --memory-limit: a size ("24G"); empty: the available memory

  // --dtype: f32 or bf16, else an Error. bf16 means bf16 weights and bf16 activations (with f32
  // accumulation), as diffusers' torch_dtype=torch.bfloat16.
  DType weight_dtype() const;
  // The device profile: --device-profile and friends, with --threads as the Cube threads unless
  // --cube-threads is given.
  DeviceProfile profile(const DeviceFlags& device_flags) const;
};
void add_generation_flags(CLI::App& command, GenerationFlags& flags);

// Before any weight loads: refuses (an Error naming both) a request whose estimated peak exceeds
// --memory-limit, or, without it, the memory available now (a simulated run: only --memory-limit). With
// --memory-limit the allocator is held to it too, so a run the estimate missed fails cleanly.
void require_memory(const GenerationFlags& flags, const pipelines::MemoryEstimate& estimate);

// {"peak_bytes", "weights_bytes", "denoising_bytes", "vae_decode_bytes"} for --json.
nlohmann::ordered_json memory_estimate_json(const pipelines::MemoryEstimate& estimate);

// The allocator's peak per phase: created right after denoising (it restarts the peak there),
// finish() after decoding gives the whole run's stats with the larger peak.
class PhasePeaks {
 public:
  static PhasePeaks after_denoising();
  AllocatorStats finish();
  nlohmann::ordered_json json() const;  // {"denoising": bytes, "vae_decode": bytes}, live peaks

 private:
  std::size_t denoising_ = 0, denoising_reserved_ = 0, vae_decode_ = 0;
};

// Communication on this rank of a multi-device run: the comm unit's kernels, the bytes they moved
// over the busiest link, the seconds its thread spent in them (waiting for the other ranks
// included) and the modelled time. Prints nothing, and gives {}, when there were none.
void print_communication(const Device& device);
nlohmann::ordered_json communication_json(const Device& device);

// --check-weights: the transformer's and the VAE's weights must be finite (names the first bad one).
void check_weights(const GenerationFlags& flags, const std::string& model_dir, const models::ParameterTable& transformer,
                   const models::ParameterTable* vae);

// Writes --trace (the device's records under `label`) and --json (`json`, already holding the
// run's fields, timings and outputs), each when asked for.
void write_outputs(const GenerationFlags& flags, const std::string& label, Device& device, const nlohmann::ordered_json& json);

struct StageTime {
  std::string name;  // "load", "text encoding", ... (JSON key: lower case, spaces become underscores)
  double seconds = 0;
};

// Prints "step i/N  x s/step  ETA y s" (or the modelled figure) on stderr after each step, with
// what the stages skipped in it when there are stages.
pipelines::StepCallback progress_printer(const pipelines::T2ITimings& timings, bool simulate,
                                         const pipelines::StageList* stages = nullptr);

double mean(const std::vector<double>& values);
// The FLOPs the device's kernels have declared so far, over all units (the run's GFLOP/s).
double declared_flops(const Device& device);

// The process's peak resident set so far (Linux VmHWM), bytes; 0 when unknown.
std::size_t peak_resident_bytes();

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
