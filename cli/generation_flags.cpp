#include "cli/generation_flags.h"

#include <cstdio>

#include "cli/output_flag.h"
#include "cli/range_flag.h"
#include "device/trace.h"
#include "pipelines/memory_estimate.h"
#include "base/error.h"
#include "base/output_file.h"
#include "base/json_text.h"

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
            try {                                      // CLI11 wants the message returned: an exception here would end the process
              pipelines::parse_memory_size(text, "");  // CLI11 puts the flag's name first
              return std::string();
            } catch (const Error& e) {
              return std::string(e.what());
            }
          },
          "SIZE"));
  command.add_option("--packed-cache", flags.packed_cache, kPackedCacheHelp)->check(packed_cache_folder());
  command.add_option(
      "--lora", flags.lora,
      "A LoRA (diffusers / PEFT, kohya Flux or Wan safetensors) fused into the transformer: FILE or FILE:SCALE (default 1); repeatable");
  command.add_flag("--lora-ignore-unmatched", flags.lora_ignore_unmatched,
                   "Skip (and count) a LoRA's layers the model does not have, instead of failing");
  command.add_option("--lora-mode", flags.lora_mode,
                     "fused (into the weights at load, as diffusers' fuse_lora; the default) or runtime (beside each layer, the weights "
                     "untouched; the default with --quant, whose int8 layers a fused LoRA would not reach)");
  command.add_option("--json", flags.json_path, "Write the timings as JSON to this file")->check(output_file_path());
  command.add_option("--trace", flags.trace_path, "Write a Chrome trace of every kernel to this file")->check(output_file_path());
}

CLI::Validator packed_cache_folder() {
  return CLI::Validator(
      [](const std::string& text) { return text.empty() ? std::string("expected a folder, got an empty path") : std::string(); }, "DIR");
}

const char* const kPackedCacheHelp =
    "A folder for the model's packed GEMM panels: the first run writes them to a file there, later processes map it "
    "read-only and shared (no packing; one copy in memory); a file for another CPU, other weights or other kernel "
    "choices is replaced";

void print_packed_cache(const char* command, const models::PackedCacheResult& cache) {
  if (!cache.ignored.empty())
    std::fprintf(stderr, "%s: packed cache: %s was made for %s; ignored\n", command, cache.file.c_str(), cache.ignored.c_str());
  std::fprintf(stderr, "%s: packed cache: %s %s (%d layers, %.1f MiB, %llu packed here, %.2f s)\n", command, cache.state.c_str(),
               cache.file.c_str(), cache.layers, static_cast<double>(cache.bytes) / (1 << 20),
               static_cast<unsigned long long>(cache.packed), cache.seconds);
}

void write_outputs(const GenerationFlags& flags, const std::string& label, Device& device, const nlohmann::ordered_json& json) {
  if (!flags.trace_path.empty()) {
    write_chrome_trace(flags.trace_path, {{label, device.trace().records()}});
    std::fprintf(stderr, "trace written to %s\n", flags.trace_path.c_str());
  }
  if (!flags.json_path.empty()) {
    write_output_file(flags.json_path, "--json", dump_json(json, 2) + "\n");
  }
}

}  // namespace cubevec::cli
