// cubevec-bench: per-stage benchmarks. Measures the machine's limits first, then runs the named
// suites and prints one row per case (median, min, max over the repeats; GFLOP/s or GB/s and the
// fraction of the measured peak where meaningful); --json writes the same rows.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "bench/harness.h"
#include "ops/gemm/cpu_caches.h"
#include "parallel/mpi_runtime.h"
#include "base/error.h"
#include "base/json_text.h"

using namespace cubevec::bench;

namespace {

int run(int argc, char** argv) {
  const std::map<std::string, Suite> suites = {{"launch", launch_suite},
                                               {"cv", cv_suite},
                                               {"instances", instances_suite},
                                               {"gemm", gemm_suite},
                                               {"vector", vector_suite},
                                               {"attention", attention_suite},
                                               {"blocks", blocks_suite},
                                               {"scaling", scaling_suite},
                                               {"cache", cache_suite},
                                               {"quant", quant_suite},
                                               {"sparse", sparse_suite},
                                               {"parse", parse_suite},
                                               {"vae", vae_suite},
                                               {"text", text_suite},
                                               {"memory", memory_suite},
                                               {"parallel", parallel_suite},
                                               {"pipeline", pipeline_suite},
                                               {"pipeline-flux", pipeline_flux_suite},
                                               {"api", api_suite},
                                               {"serve", serve_suite},
                                               {"serve-flux", serve_flux_suite},
                                               {"python-ops", python_ops_suite},
                                               {"images", images_suite}};
  std::string names;
  for (const auto& [name, suite] : suites) names += (names.empty() ? "" : ", ") + name;

  CLI::App app{"cubevec-bench: per-stage benchmarks of cubevec"};
  std::vector<std::string> chosen;
  std::string json_path;
  int repeats = 5;
  app.add_option("suites", chosen,
                 "Suites to run (" + names + "); default: all but memory, pipeline-flux and serve-flux (they write 24 GB and 2 GB models)");
  app.add_option("--json", json_path, "Also write the results as JSON to this file");
  app.add_option("--repeats", repeats, "Timed runs per case")->check(CLI::Range(1, 1000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  if (chosen.empty())
    for (const auto& [name, suite] : suites)
      if (name != "memory" && name != "pipeline-flux" && name != "serve-flux") chosen.push_back(name);
  for (const std::string& name : chosen)
    if (!suites.count(name)) {
      std::fprintf(stderr, "error: unknown suite '%s' (expected one of: %s)\n", name.c_str(), names.c_str());
      return 1;
    }

  try {
    Context context;
    context.repeats = repeats;
    const bool printer = cubevec::parallel::world_rank() == 0;  // under mpirun, rank 0 speaks
    if (printer) std::fprintf(stderr, "measuring the machine...\n");
    context.machine = measure_machine();
    const Machine& m = context.machine;
    if (printer)
      std::fprintf(stderr,
                   "machine: %s, %d threads: FMA peak %.1f GFLOP/s (%.1f on one thread), triad %.1f GB/s, VNNI int8 peak %.1f GOP/s, "
                   "bf16 dot peak %.1f GFLOP/s, AMX-BF16 peak %.1f GFLOP/s, AMX-INT8 peak %.1f GOP/s, AVX2 vpmaddwd int8 peak %.1f GOP/s "
                   "(0: absent)\n",
                   m.isa.c_str(), m.threads, m.fma_peak_gflops, m.fma_peak_1t_gflops, m.triad_gbps, m.vnni_peak_gops,
                   m.bf16_dot_peak_gflops, m.amx_peak_gflops, m.amx_int8_peak_gops, m.madd16_peak_gops);
    if (printer)
      std::fprintf(stderr, "cpu: %s; caches %s\n\n", cubevec::ops::gemm::cpu_model_name().c_str(),
                   cubevec::ops::gemm::this_cpu_caches().text().c_str());
    if (printer)
      std::fprintf(stderr, "%-10s %-34s %-22s %-5s %11s %11s %11s\n", "suite", "case", "impl", "dtype", "median ms", "min ms", "max ms");
    for (const std::string& name : chosen) suites.at(name)(context);

    if (!json_path.empty() && cubevec::parallel::world_rank() == 0) {
      nlohmann::ordered_json json;
      json["machine"] = {{"isa", m.isa},
                         {"threads", m.threads},
                         {"fma_peak_gflops", m.fma_peak_gflops},
                         {"fma_peak_1t_gflops", m.fma_peak_1t_gflops},
                         {"triad_gbps", m.triad_gbps},
                         {"vnni_peak_gops", m.vnni_peak_gops},
                         {"bf16_dot_peak_gflops", m.bf16_dot_peak_gflops},
                         {"amx_peak_gflops", m.amx_peak_gflops},
                         {"amx_int8_peak_gops", m.amx_int8_peak_gops},
                         {"madd16_peak_gops", m.madd16_peak_gops},
                         {"cpu", cubevec::ops::gemm::cpu_model_name()},
                         {"caches", cubevec::ops::gemm::this_cpu_caches().text()}};
      json["results"] = nlohmann::json::array();
      for (const Result& r : context.results) {
        nlohmann::ordered_json row = {{"suite", r.suite},
                                      {"case", r.case_name},
                                      {"impl", r.impl},
                                      {"dtype", r.dtype},
                                      {"median_s", r.timing.median_s},
                                      {"min_s", r.timing.min_s},
                                      {"max_s", r.timing.max_s},
                                      {"runs", r.timing.runs},
                                      {"gflops", r.gflops},
                                      {"gbps", r.gbps},
                                      {"peak_fraction", r.peak_fraction}};
        for (const auto& [key, value] : r.extra) row[key] = value;
        json["results"].push_back(row);
      }
      std::ofstream out(json_path);
      out << cubevec::dump_json(json, 2) << "\n";
      if (!out) throw cubevec::Error(json_path + ": cannot write the JSON results");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace

// Under mpirun (the `parallel` suite) every rank runs the suites; rank 0 prints and writes the JSON.
int main(int argc, char** argv) {
  if (cubevec::parallel::launched_by_mpirun()) cubevec::parallel::ensure_mpi();
  const int status = run(argc, argv);
  cubevec::parallel::finalize(status);
  return status;
}
