// The flags t2i and t2v share: --dtype, --variant, --threads, --simulate, --check-weights,
// --memory-limit, --packed-cache, --json and --trace; and the outputs --json and --trace write.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/device_flags.h"
#include "device/device.h"
#include "models/packed_cache.h"

namespace cubevec::cli {

struct GenerationFlags {
  std::string dtype = "f32", json_path, trace_path, variant;
  int threads = 0;
  bool simulate = false;
  bool check_weights = false;          // --check-weights: every loaded weight must be finite
  std::string memory_limit;            // --memory-limit: a size ("24G"); empty: the available memory
  std::string packed_cache;            // --packed-cache DIR: map the packed GEMM panels from a file there
  std::vector<std::string> lora;       // --lora FILE[:SCALE], repeatable: fused into the transformer
  bool lora_ignore_unmatched = false;  // --lora-ignore-unmatched
  std::string lora_mode;               // --lora-mode fused | runtime (empty: fused, runtime with --quant)

  // --dtype: f32 or bf16, else an Error. bf16 means bf16 weights and bf16 activations (with f32
  // accumulation), as diffusers' torch_dtype=torch.bfloat16.
  DType weight_dtype() const;
  // The device profile: --device-profile and friends, with --threads as the Cube threads unless
  // --cube-threads is given.
  DeviceProfile profile(const DeviceFlags& device_flags) const;
};
void add_generation_flags(CLI::App& command, GenerationFlags& flags);
// The --packed-cache flag's help and check (t2i, t2v and serve: a folder, not an empty path).
extern const char* const kPackedCacheHelp;
CLI::Validator packed_cache_folder();
// "<command>: packed cache: mapped FILE (N layers, X MiB in S s)" and, when an old file was
// ignored, why; on stderr.
void print_packed_cache(const char* command, const models::PackedCacheResult& cache);

// Writes --trace (the device's records under `label`) and --json (`json`), each when asked for.
void write_outputs(const GenerationFlags& flags, const std::string& label, Device& device, const nlohmann::ordered_json& json);

}  // namespace cubevec::cli
