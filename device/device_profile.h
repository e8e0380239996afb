// DeviceProfile: how the emulated device maps onto this CPU (threads per unit) and the figures of
// the NPU it models (peaks, bandwidth, launch overhead) for the cost model. Loaded from JSON in
// assets/devices/; every field is required and checked, so a typo is an error, not a default.
#pragma once

#include <map>
#include <string>

#include "tensor/dtype.h"

namespace cubevec {

struct DeviceProfile {
  std::string name;
  std::string source;  // the file it came from, or "built-in"

  // This CPU.
  int cube_threads = 1;    // threads of the Cube unit's arena
  int vector_threads = 1;  // threads of the Vector unit's arena
  bool pin_units = false;  // pin each unit's threads to their own cores
  // The thread counts are this process's share of the machine (the built-in profile), not asked
  // for by a file, a flag or the environment: a server running several instances divides them.
  bool machine_sized = false;

  // The modelled NPU.
  int ai_cores = 1;                       // Cube cores (AIC)
  int vector_cores = 1;                   // Vector cores (AIV)
  std::map<DType, double> cube_tflops;    // Cube peak by compute dtype
  std::map<DType, double> vector_tflops;  // Vector peak by compute dtype
  double hbm_gbps = 1;                    // device-memory bandwidth
  double l2_mib = 0;                      // L2 cache size (reported; the simple cost model ignores it)
  double launch_overhead_us = 0;          // added to every kernel

  // Its links (the optional "links" object): what communication kernels cost. A profile without
  // them can run communication for real but not model it.
  bool has_links = false;
  double peer_gbps = 0;        // one direction of the link to each peer card (HCCS)
  double peer_latency_us = 0;  // added to every transfer between cards
  double host_gbps = 0;        // one direction of the card's link to the host (PCIe)

  // How kernels reach those peaks (the optional "kernels" object; without it every kernel runs at
  // its unit's peak, as the simple model). See device/cost_model.h.
  bool has_kernel_model = false;
  double cube_efficiency = 1;            // a GEMM's fraction of the Cube peak, before tile and wave losses
  double attention_efficiency = 1;       // the same for attention's Cube work
  double vector_efficiency = 1;          // a Vector kernel's fraction of the Vector peak
  int cube_tile_m = 0, cube_tile_n = 0;  // one AI core's output tile (0: no quantization)
  double attention_vector_ops = 0;       // Vector operations per attention score (the online softmax)
  // Optional ("attention_keys"): attention's efficiency by its key length S, the kernel's inner
  // loop: attention_efficiency x g(S) / g(reference) with g(S) = S / (S + half_rate), S clamped to
  // [shortest, longest], the range the figures behind half_rate were measured over. reference = 0:
  // one efficiency for every length.
  struct AttentionKeys {
    double reference = 0, half_rate = 0, shortest = 0, longest = 0;
  } attention_keys;
  // attention_efficiency at `key_length` keys (0: unknown, the reference efficiency).
  double attention_efficiency_at(int64_t key_length) const;
  double host_issue_us = 0;  // host time to issue one kernel to a stream (eager launch)

  // Peak of `unit` for `dtype`; throws naming the profile when it has no figure for that dtype.
  double peak_tflops(bool cube, DType dtype) const;
};

// Parses and validates a profile; `source` names it in errors.
DeviceProfile parse_device_profile(const std::string& json_text, const std::string& source);
DeviceProfile load_device_profile(const std::string& path);

// The profile used when none is named: the same NPU figures as assets/devices/cpu-default.json,
// and both units sized to this process's share of the machine (machine_unit_threads()): either
// unit can use every core while the other waits, which is most of a DiT's time (Note [Sizing the
// units from the machine] in device_profile.cpp).
DeviceProfile builtin_cpu_profile();

// The cores this process may use (its affinity mask: taskset, a container's cpuset, mpirun's
// binding), shared among the ranks mpirun started on this machine (OMPI_COMM_WORLD_LOCAL_SIZE,
// MPI_LOCALNRANKS: the first readable one); at least 1.
int machine_unit_threads();

// `profile` for one of `instances` instances sharing this process: a machine-sized profile's
// threads divided among them (at least 1 each); a profile whose threads were asked for, unchanged.
DeviceProfile profile_for_instance(DeviceProfile profile, int instances);

// Applies CUBEVEC_CUBE_THREADS / CUBEVEC_VECTOR_THREADS from the environment, then the given
// overrides (0 = keep). Throws on a value that is not a positive integer.
void apply_thread_overrides(DeviceProfile& profile, int cube_threads = 0, int vector_threads = 0);
// The most threads a unit may have: 16 per hardware thread (apply_thread_overrides checks it).
int max_unit_threads();

}  // namespace cubevec
