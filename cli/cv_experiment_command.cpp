// `cubevec cv-experiment`: the balanced Cube + Vector workload of pipelines/cv_experiment.h run
// serialized, overlapped and pinned; prints measured and modelled figures.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/output_flag.h"
#include "cli/command.h"
#include "cli/device_flags.h"
#include "cli/range_flag.h"
#include "pipelines/cv_experiment.h"
#include "base/output_file.h"
#include "base/json_text.h"

namespace cubevec::cli {

namespace {

struct CvFlags {
  CvWorkload workload;
  int repeats = 3;
  std::string json_path, trace_path;
};

int run(const CvFlags& flags, const DeviceFlags& device_flags) {
  const DeviceProfile profile = device_flags.resolve();
  const CvWorkload& w = flags.workload;
  std::fprintf(stderr,
               "cv-experiment: %d chunks; Cube: GEMM %lldx%lldx%lld (MxNxK); Vector: rms_norm, gelu-tanh, softmax on "
               "[%lld, %lld]\nprofile %s (%s): %d Cube thread(s), %d Vector thread(s); median of %d runs\n\n",
               w.chunks, static_cast<long long>(w.m), static_cast<long long>(w.n), static_cast<long long>(w.k), static_cast<long long>(w.m),
               static_cast<long long>(w.n), profile.name.c_str(), profile.source.c_str(), profile.cube_threads, profile.vector_threads,
               flags.repeats);

  std::vector<CvResult> results;
  for (CvMode mode : kAllCvModes) {
    std::fprintf(stderr, "running %s...\n", std::string(cv_mode_name(mode)).c_str());
    results.push_back(run_cv_experiment(w, mode, profile, flags.repeats));
    if (results.back().checksum != results.front().checksum)
      throw Error("cv-experiment: the " + std::string(cv_mode_name(mode)) + " run computed different results from the serialized run");
  }

  const double serial_wall = results[0].wall_s, serial_modelled = results[0].modelled_s;
  std::fprintf(stderr, "\n%-11s %9s %9s %9s %8s %8s %12s %9s\n", "mode", "wall ms", "cube ms", "vector ms", "overlap", "speedup",
               "modelled ms", "modelled");
  std::fprintf(stderr, "%-11s %9s %9s %9s %8s %8s %12s %9s\n", "", "", "busy", "busy", "", "(wall)", "NPU", "speedup");
  nlohmann::ordered_json json = {{"workload", {{"chunks", w.chunks}, {"m", w.m}, {"n", w.n}, {"k", w.k}}},
                                 {"profile", profile.name},
                                 {"repeats", flags.repeats},
                                 {"modes", nlohmann::json::array()}};
  for (const CvResult& r : results) {
    std::fprintf(stderr, "%-11s %9.2f %9.2f %9.2f %7.0f%% %7.2fx %12.3f %8.2fx\n", std::string(cv_mode_name(r.mode)).c_str(),
                 r.wall_s * 1e3, r.cube_busy_s * 1e3, r.vector_busy_s * 1e3, r.overlap_fraction * 100, serial_wall / r.wall_s,
                 r.modelled_s * 1e3, serial_modelled / r.modelled_s);
    json["modes"].push_back({{"mode", cv_mode_name(r.mode)},
                             {"wall_s", r.wall_s},
                             {"walls_s", r.walls_s},
                             {"cube_busy_s", r.cube_busy_s},
                             {"vector_busy_s", r.vector_busy_s},
                             {"overlap_fraction", r.overlap_fraction},
                             {"speedup_vs_serialized", serial_wall / r.wall_s},
                             {"modelled_s", r.modelled_s},
                             {"modelled_speedup_vs_serialized", serial_modelled / r.modelled_s}});
  }
  if (!flags.json_path.empty()) {
    write_output_file(flags.json_path, "--json", dump_json(json, 2) + "\n");
  }
  if (!flags.trace_path.empty()) {
    std::vector<TraceSection> sections;
    for (const CvResult& r : results) sections.push_back({std::string(cv_mode_name(r.mode)), r.records});
    write_chrome_trace(flags.trace_path, sections);
    std::fprintf(stderr, "\ntrace written to %s (open it in https://ui.perfetto.dev)\n", flags.trace_path.c_str());
  }
  return 0;
}

}  // namespace

CommandRunner add_cv_experiment_command(CLI::App& app) {
  auto* command = app.add_subcommand(
      "cv-experiment", "Run a balanced Cube + Vector workload serialized, overlapped and pinned; compare measured and modelled times");
  auto flags = std::make_shared<CvFlags>();
  auto device_flags = add_device_flags(*command);
  command->add_option("--chunks", flags->workload.chunks, "Independent chunks of work")->check(in_range(1, 100000));
  command->add_option("--m", flags->workload.m, "GEMM rows per chunk (M)")->check(in_range(1, 1 << 20));
  command->add_option("--n", flags->workload.n, "GEMM columns (N), also the Vector row width")->check(in_range(1, 1 << 20));
  command->add_option("--k", flags->workload.k, "GEMM inner size (K)")->check(in_range(1, 1 << 20));
  command->add_option("--repeats", flags->repeats, "Timed runs per mode (the median is reported)")->check(in_range(1, 1000));
  command->add_option("--json", flags->json_path, "Write the figures as JSON to this file")->check(output_file_path());
  command->add_option("--trace", flags->trace_path, "Write a Chrome trace (all three modes) to this file")->check(output_file_path());
  return [flags, device_flags] { return run(*flags, *device_flags); };
}

}  // namespace cubevec::cli
