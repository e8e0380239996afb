#include "device/device_profile.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>
#include <system_error>
#include <thread>

#include <sched.h>

#include "base/error.h"
#include "base/regular_file.h"
#include "base/strict_json.h"

namespace cubevec {

namespace {

using Json = nlohmann::json;

// Reads a JSON object's fields, refusing unknown ones, so that every mistake names its key.
class FieldReader {
 public:
  FieldReader(const Json& object, std::string where) : object_(object), where_(std::move(where)) {
    if (!object.is_object()) throw Error(where_ + ": expected a JSON object, got " + object.type_name());
  }
  const Json& get(const std::string& key) {
    seen_.insert(key);
    if (!object_.contains(key)) throw Error(where_ + ": missing required field \"" + key + "\"");
    return object_[key];
  }
  // A finite number in [lo, hi]: figures outside a plausible range (a 1e-320 bandwidth, 1e308
  // TFLOP/s) would model times of inf or 0 and make every simulated figure meaningless.
  double number_in(const std::string& key, double lo, double hi, const char* unit) {
    const Json& v = get(key);
    const double x = v.is_number() ? v.get<double>() : 0;
    if (!v.is_number() || !std::isfinite(x) || x > hi || x < lo) {
      std::ostringstream range;
      range << "from " << lo << " to " << hi << " " << unit;
      throw Error(where_ + "." + key + ": expected a number " + range.str() + ", got " + v.dump());
    }
    return x;
  }
  int positive_int(const std::string& key) {
    const Json& v = get(key);
    if (!v.is_number_unsigned() || v.get<uint64_t>() == 0 || v.get<uint64_t>() > 4096)
      throw Error(where_ + "." + key + ": expected an integer from 1 to 4096, got " + v.dump());
    return static_cast<int>(v.get<uint64_t>());
  }
  std::map<DType, double> tflops_table(const std::string& key) {
    std::map<DType, double> table;
    FieldReader inner(get(key), where_ + "." + key);
    for (const auto& [name, value] : inner.object_.items()) {
      DType dtype{};
      try {
        dtype = parse_dtype(name);  // names the known dtypes
      } catch (const Error& e) {
        throw Error(where_ + "." + key + ": " + e.what());
      }
      table[dtype] = inner.number_in(name, 1e-6, 1e6, "TFLOP/s");
    }
    if (table.empty()) throw Error(where_ + "." + key + ": expected at least one dtype, e.g. {\"bf16\": 313}");
    return table;
  }
  FieldReader object(const std::string& key) { return FieldReader(get(key), where_ + "." + key); }
  bool has(const std::string& key) const { return object_.contains(key); }
  void reject_unknown() const {
    for (const auto& [key, value] : object_.items())
      if (!seen_.count(key)) throw Error(where_ + ": unknown field \"" + key + "\"");
  }

 private:
  const Json& object_;
  std::string where_;
  std::set<std::string> seen_;
};

int positive_env_int(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text) return 0;
  // Digits only (strtol would take leading spaces and a '+').
  const std::string_view digits(text);
  int value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size() || value < 1 || value > 4096)
    throw Error(std::string("environment variable ") + name + "=" + text_for_message(digits) + ": expected an integer from 1 to 4096");
  return value;
}

}  // namespace

double DeviceProfile::peak_tflops(bool cube, DType dtype) const {
  const auto& table = cube ? cube_tflops : vector_tflops;
  const auto it = table.find(dtype);
  if (it == table.end())
    throw Error("device profile '" + name + "' (" + source + ") has no " + (cube ? "cube" : "vector") + "_tflops figure for " +
                std::string(dtype_name(dtype)));
  return it->second;
}

DeviceProfile parse_device_profile(const std::string& json_text, const std::string& source) {
  Json json;
  try {
    json = parse_strict_json(json_text, 3);
  } catch (const StrictJsonError& e) {
    throw Error(source + ": " + e.what());
  }
  DeviceProfile p;
  p.source = source;
  FieldReader top(json, source);
  const Json& name = top.get("name");
  if (!name.is_string() || name.get<std::string>().empty()) throw Error(source + ".name: expected a non-empty string");
  p.name = name.get<std::string>();
  if (json.contains("description")) top.get("description");  // free text for readers

  FieldReader cpu = top.object("cpu");
  p.cube_threads = cpu.positive_int("cube_threads");
  p.vector_threads = cpu.positive_int("vector_threads");
  const Json& pin = cpu.get("pin_units");
  if (!pin.is_boolean()) throw Error(source + ".cpu.pin_units: expected true or false, got " + pin.dump());
  p.pin_units = pin.get<bool>();
  cpu.reject_unknown();

  FieldReader npu = top.object("npu");
  p.ai_cores = npu.positive_int("ai_cores");
  p.vector_cores = npu.positive_int("vector_cores");
  p.cube_tflops = npu.tflops_table("cube_tflops");
  p.vector_tflops = npu.tflops_table("vector_tflops");
  p.hbm_gbps = npu.number_in("hbm_gbps", 1e-3, 1e6, "GB/s");
  p.l2_mib = npu.number_in("l2_mib", 0, 1e6, "MiB");
  p.launch_overhead_us = npu.number_in("launch_overhead_us", 0, 1e6, "microseconds");
  npu.reject_unknown();
  if (json.contains("links")) {
    FieldReader links = top.object("links");
    p.has_links = true;
    p.peer_gbps = links.number_in("peer_gbps", 1e-3, 1e6, "GB/s");
    p.peer_latency_us = links.number_in("peer_latency_us", 0, 1e6, "microseconds");
    p.host_gbps = links.number_in("host_gbps", 1e-3, 1e6, "GB/s");
    links.reject_unknown();
  }
  if (json.contains("kernels")) {
    FieldReader kernels = top.object("kernels");
    p.has_kernel_model = true;
    p.cube_efficiency = kernels.number_in("cube_efficiency", 1e-3, 1, "(a fraction of the peak)");
    p.attention_efficiency = kernels.number_in("attention_efficiency", 1e-3, 1, "(a fraction of the peak)");
    p.vector_efficiency = kernels.number_in("vector_efficiency", 1e-3, 1, "(a fraction of the peak)");
    const Json& tile = kernels.get("cube_tile");
    if (!tile.is_array() || tile.size() != 2 || !tile[0].is_number_unsigned() || !tile[1].is_number_unsigned() ||
        tile[0].get<uint64_t>() < 1 || tile[0].get<uint64_t>() > 4096 || tile[1].get<uint64_t>() < 1 || tile[1].get<uint64_t>() > 4096)
      throw Error(source + ".kernels.cube_tile: expected [rows, columns], two integers from 1 to 4096, got " + tile.dump());
    p.cube_tile_m = static_cast<int>(tile[0].get<uint64_t>());
    p.cube_tile_n = static_cast<int>(tile[1].get<uint64_t>());
    p.attention_vector_ops = kernels.number_in("attention_vector_ops", 0, 1e3, "operations per score");
    if (kernels.has("attention_keys")) {  // optional: profiles without it keep one efficiency
      FieldReader keys = kernels.object("attention_keys");
      auto& k = p.attention_keys;
      k.reference = keys.number_in("reference", 1, 1e9, "keys");
      k.half_rate = keys.number_in("half_rate", 1, 1e9, "keys");
      k.shortest = keys.number_in("shortest", 1, 1e9, "keys");
      k.longest = keys.number_in("longest", 1, 1e9, "keys");
      keys.reject_unknown();
      if (!(k.shortest <= k.reference && k.reference <= k.longest))
        throw Error(source + ".kernels.attention_keys: expected shortest <= reference <= longest, got " + std::to_string(k.shortest) +
                    ", " + std::to_string(k.reference) + ", " + std::to_string(k.longest));
    }
    p.host_issue_us = kernels.number_in("host_issue_us", 0, 1e6, "microseconds");
    kernels.reject_unknown();
  }
  top.reject_unknown();
  return p;
}

double DeviceProfile::attention_efficiency_at(int64_t key_length) const {
  const AttentionKeys& k = attention_keys;
  if (k.reference <= 0 || key_length <= 0) return attention_efficiency;
  const auto rate = [&](double keys) { return keys / (keys + k.half_rate); };
  const double keys = std::clamp(static_cast<double>(key_length), k.shortest, k.longest);
  return std::min(1.0, attention_efficiency * rate(keys) / rate(k.reference));
}

DeviceProfile load_device_profile(const std::string& path) { return parse_device_profile(read_regular_file(path), path); }

// Note [Sizing the units from the machine]
// On a CPU the two units share the same cores. A DiT step is mostly a chain (GEMM, then the vector
// ops on its output, then the next GEMM), so at any moment one unit is usually waiting for the
// other: giving each unit every core lets the running one use the whole machine. Where both run at
// once (the CV-overlapped kernel pairs) they share the cores through TBB and the OS. Measured on 2
// cores (tinywan 192x192, docs/performance.md "Sizing the units"): 2 Cube threads against 1 make
// the denoising 1.4x and the VAE decode 1.5x faster, and 2 Vector threads cost nothing beside 1.
// The shipped cpu-default.json keeps 1 + 1, the split its NPU figures were measured with.
DeviceProfile builtin_cpu_profile() {
  DeviceProfile p;
  p.name = "cpu-default";
  p.source = "built-in";
  p.cube_threads = machine_unit_threads();
  p.vector_threads = p.cube_threads;
  p.pin_units = false;
  p.machine_sized = true;
  // Keep in step with assets/devices/cpu-default.json (a test compares them).
  p.ai_cores = 1;
  p.vector_cores = 1;
  p.cube_tflops = {{DType::f32, 0.23}, {DType::bf16, 0.46}, {DType::f16, 0.23}, {DType::i8, 0.92}};
  p.vector_tflops = {{DType::f32, 0.23}, {DType::bf16, 0.23}, {DType::f16, 0.23}};
  p.hbm_gbps = 37;
  p.l2_mib = 1;
  p.launch_overhead_us = 0.5;
  p.has_links = true;
  p.peer_gbps = 10;
  p.peer_latency_us = 2;
  p.host_gbps = 37;
  return p;
}

void apply_thread_overrides(DeviceProfile& profile, int cube_threads, int vector_threads) {
  std::string cube_origin = profile.source + " cube_threads", vector_origin = profile.source + " vector_threads";
  bool asked = false;  // a count came from the environment or a flag
  if (cube_threads < 0 || vector_threads < 0) throw Error("thread counts must be positive");
  // A flag wins: the environment variable of a unit whose flag is given is not even read.
  if (const int env = cube_threads > 0 ? 0 : positive_env_int("CUBEVEC_CUBE_THREADS"))
    profile.cube_threads = env, cube_origin = "CUBEVEC_CUBE_THREADS", asked = true;
  if (const int env = vector_threads > 0 ? 0 : positive_env_int("CUBEVEC_VECTOR_THREADS"))
    profile.vector_threads = env, vector_origin = "CUBEVEC_VECTOR_THREADS", asked = true;
  if (cube_threads > 0) profile.cube_threads = cube_threads, cube_origin = "--cube-threads (or --threads)", asked = true;
  if (vector_threads > 0) profile.vector_threads = vector_threads, vector_origin = "--vector-threads", asked = true;
  if (asked) profile.machine_sized = false;
  const int limit = max_unit_threads();
  for (const auto& [count, origin] : {std::pair{profile.cube_threads, &cube_origin}, {profile.vector_threads, &vector_origin}})
    if (count > limit)
      throw Error(*origin + " " + std::to_string(count) + " is above this machine's limit of " + std::to_string(limit) +
                  " threads a unit (16 x its " + std::to_string(std::max(1u, std::thread::hardware_concurrency())) +
                  " hardware threads); more only add scheduling cost");
}

int machine_unit_threads() {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = std::max(1, CPU_COUNT(&set));
  int ranks = 1;  // mpirun's processes on this machine; an unreadable count is taken as 1
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    const char* text = std::getenv(name);
    if (!text || !*text) continue;
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (*end != '\0' || value < 1 || value > 1 << 20) continue;  // unreadable: the next variable, else one rank
    ranks = static_cast<int>(value);
    break;
  }
  return std::max(1, cores / ranks);
}

DeviceProfile profile_for_instance(DeviceProfile profile, int instances) {
  if (!profile.machine_sized || instances <= 1) return profile;
  profile.cube_threads = std::max(1, profile.cube_threads / instances);
  profile.vector_threads = std::max(1, profile.vector_threads / instances);
  return profile;
}

int max_unit_threads() { return 16 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

}  // namespace cubevec
