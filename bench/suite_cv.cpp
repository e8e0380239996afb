// Suite `cv`: the cv-experiment workload (pipelines/cv_experiment.h) serialized, overlapped and
// pinned on this CPU, with the cost model's prediction for the same schedules beside it (for this
// CPU's profile and for the 910B profile).
#include "bench/harness.h"
#include "pipelines/cv_experiment.h"

namespace cubevec::bench {

void cv_suite(Context& context) {
  const CvWorkload workload;
  const DeviceProfile npu = load_device_profile(CUBEVEC_SOURCE_DIR "/assets/devices/ascend-910b.json");
  const std::string case_name = std::to_string(workload.chunks) + "x(" + std::to_string(workload.m) + "x" + std::to_string(workload.n) +
                                "x" + std::to_string(workload.k) + ")";
  std::vector<CvResult> results;
  double serial_npu_modelled = 0;
  for (CvMode mode : kAllCvModes) {
    CvResult r = run_cv_experiment(workload, mode, builtin_cpu_profile(), context.repeats);
    const double npu_modelled = run_cv_experiment(workload, mode, npu, 1).modelled_s;
    if (mode == CvMode::serialized) serial_npu_modelled = npu_modelled;
    Result row{"cv", case_name, std::string(cv_mode_name(mode))};
    row.timing = summarize(r.walls_s);
    const double flops = 2.0 * workload.chunks * static_cast<double>(workload.m * workload.n * workload.k);
    row.gflops = flops / row.timing.median_s / 1e9;
    row.peak_fraction = row.gflops / context.machine.fma_peak_gflops;
    row.extra["speedup"] = results.empty() ? 1.0 : results[0].wall_s / r.wall_s;
    row.extra["overlap"] = r.overlap_fraction;
    row.extra["modelled_cpu_speedup"] = results.empty() ? 1.0 : results[0].modelled_s / r.modelled_s;
    row.extra["modelled_910b_ms"] = npu_modelled * 1e3;
    row.extra["modelled_910b_speedup"] = serial_npu_modelled / npu_modelled;
    context.add(row);
    results.push_back(std::move(r));
  }
}

}  // namespace cubevec::bench
