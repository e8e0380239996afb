// The CV-parallel experiment: the same balanced Cube + Vector workload run three ways, to see what
// overlapping the two units buys on this CPU and on the modelled NPU.
//
// Workload: `chunks` independent chunks. Chunk i: Y_i = X_i [M, K] x W [K, N] on the Cube unit,
// then Z_i = softmax(gelu_tanh(rms_norm(Y_i))) on the Vector unit. W is shared.
// Modes: serialized (one stream: each chunk's Vector work waits for its GEMM, and the next GEMM
// for that Vector work), overlapped (GEMMs on a Cube stream, Vector chains on a Vector stream:
// GEMM i+1 runs while chunk i is normalized), and pinned (overlapped, each unit's threads pinned
// to their own cores).
#pragma once

#include <string>
#include <vector>

#include "device/device.h"

namespace cubevec {

struct CvWorkload {
  int chunks = 32;
  int64_t m = 512, n = 1024, k = 64;
};

enum class CvMode { serialized, overlapped, pinned };
inline constexpr CvMode kAllCvModes[] = {CvMode::serialized, CvMode::overlapped, CvMode::pinned};
std::string_view cv_mode_name(CvMode mode);

struct CvResult {
  CvMode mode;
  double wall_s = 0;       // host: first launch to synchronize, median over the repeats
  double cube_busy_s = 0;  // union of the Cube kernels' real intervals (median run)
  double vector_busy_s = 0;
  double overlap_fraction = 0;        // time both units were busy / wall time
  double modelled_s = 0;              // the modelled NPU's end-to-end time
  std::vector<double> walls_s;        // every timed repeat
  std::vector<KernelRecord> records;  // trace of the median run
  std::vector<float> checksum;        // per chunk: sum of Z_i (the same in every mode)
};

// Runs `repeats` timed runs (after one warm-up) in `mode` on a device made from `profile`.
CvResult run_cv_experiment(const CvWorkload& workload, CvMode mode, const DeviceProfile& profile, int repeats);
// busy_time and overlap_time, which the experiment's figures come from, are in device/trace.h.

}  // namespace cubevec
