// A model's packed GEMM panels in a file (`--packed-cache DIR`), written once and then mapped
// read-only by every later process: a second `cubevec serve` or `t2i` starts without packing, and
// the machine holds the panels once in its page cache however many processes map them (MindIE
// SD's share_memory, where secondary processes map the primary's weights).
//
// The file (<model>-<identity hash>.cvpack) is an 8-byte magic, a little-endian 64-bit header
// length, a JSON header, then each layer's panels at a 4096-byte aligned offset. The header
// records the CPU model and ISA, the thread count the kernels were chosen for, the model's
// checksum (a hash of every packed layer's weight as loaded), and per layer: name, N, K, compute
// type, the bf16 kernel, KC, the panel stride, offset, bytes, the weight's hash and the panels'.
//
// A file made on another CPU, for other weights or for other kernel choices (a recalibration
// chose another bf16 kernel) is ignored with a note, and the panels are packed and the file
// rewritten (a new file renamed over the old: processes that map the old one keep it). A file
// that cannot be what this writer wrote (a bad magic or header, a record past the end, panels
// that no longer match their hash) is an Error naming it, never mapped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/parameters.h"

namespace cubevec::models {

struct PackedCacheModel {
  std::string name;      // the model's folder name: the file's name and the notes
  std::string identity;  // what else tells loads apart (folder path, dtype, quantization): the file name's hash
  // The tables whose float Linears are cached, each with its component's name ("transformer",
  // "vae") so that layer names stay unique in the file.
  std::vector<std::pair<std::string, const ParameterTable*>> tables;
  int threads = 0;  // the Cube unit's threads (the calibration's choice depends on them)
};

struct PackedCacheResult {
  std::string file;
  std::string state;    // "mapped" (an existing file) or "written" (packed here, then mapped)
  std::string ignored;  // why an existing file was not used ("" when none was, or it was used)
  int layers = 0;       // Linears using the file's panels
  std::size_t bytes = 0;
  uint64_t packed = 0;  // panels packed here for the cached layers (0 when mapped)
  double seconds = 0;
  nlohmann::ordered_json json() const;
};

// Maps `dir`'s file for `model` into every float Linear of its tables, writing it first when it is
// missing, stale or foreign. `dir` is created when its parent exists. Layers with a kernel
// (quantized, tensor-parallel) or no weight in memory are not cached.
PackedCacheResult use_packed_cache(const std::string& dir, const PackedCacheModel& model);

// The file use_packed_cache reads and writes for `model` in `dir`.
std::string packed_cache_path(const std::string& dir, const PackedCacheModel& model);

}  // namespace cubevec::models
