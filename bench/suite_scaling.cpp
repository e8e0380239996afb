// Suite `scaling` (issue 41, "16-core scaling"): the f32 Flux double and single blocks and the
// Wan2.1-1.3B block of the `blocks` suite on 1, 2, 4, ... cores up to the cores this process may
// use (taskset narrows it): at each count every thread of the process is confined to the first
// `count` of its cores and both units get `count` threads (so at one core the Cube and Vector
// units share it: a true one-core baseline), and the attention autotuner tunes afresh (its picks
// are not keyed by thread count, and the CV-pipelined attention's worth depends on spare cores).
// Per block and count: the time, the fraction
// of the FMA peak measured at that thread count in the same run, the speedup over one thread and
// its efficiency (speedup / threads) and the share of the traced run when no kernel ran (launch
// gaps: host, dispatcher, waking threads); then per kernel name, its measured kernel time at every
// count and its own speedup and efficiency at the largest, so that what stops scaling (small GEMMs
// split too finely, vector ops, attention, the gaps) shows by name.
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "bench/block_inputs.h"
#include "bench/harness.h"
#include "bench/traced_run.h"
#include "device/device_profile.h"
#include "ops/attention_tuner.h"

namespace cubevec::bench {

namespace {

// The process's cores, and every thread of it confined to some of them (new threads inherit the
// creating thread's set, so TBB's workers started later follow too).
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

void confine_process(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", error))
    sched_setaffinity(static_cast<pid_t>(std::stol(task.path().filename().string())), sizeof set, &set);
}

// 1, 2, 4, ... below `most`, then `most`.
std::vector<int> thread_counts(int most) {
  std::vector<int> out;
  for (int t = 1; t < most; t *= 2) out.push_back(t);
  out.push_back(most);
  return out;
}

struct BlockScaling {
  std::string label;
  std::vector<TracedRun> runs;  // one per thread count
};

void report(Context& context, const BlockScaling& block, const std::vector<int>& counts, const std::vector<double>& peaks) {
  const TracedRun& one = block.runs.front();
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const TracedRun& run = block.runs[i];
    Result r{"scaling", block.label + ", " + std::to_string(counts[i]) + " core" + (counts[i] == 1 ? "" : "s"), "cubevec"};
    r.timing = run.timing;
    r.gflops = run.flops / run.timing.median_s / 1e9;
    r.peak_fraction = r.gflops / peaks[i];
    r.extra["threads"] = counts[i];
    r.extra["speedup"] = one.timing.median_s / run.timing.median_s;
    r.extra["efficiency"] = r.extra["speedup"] / counts[i];
    // The traced run's time when no kernel ran: launch gaps (host, dispatcher, waking threads).
    r.extra["idle_share"] = run.traced_s > 0 ? std::max(0.0, 1.0 - run.busy_s / run.traced_s) : 0.0;
    context.add(r);
  }
  // Per kernel name, largest first at the largest count. Kernel times come from one traced run
  // each, so they are noisier than the blocks' medians.
  const TracedRun& most = block.runs.back();
  std::vector<std::pair<double, std::string>> names;
  for (const auto& [name, s] : most.op_s) names.push_back({s, name});
  std::sort(names.rbegin(), names.rend());
  double total_most = 0;
  for (const auto& [s, name] : names) total_most += s;
  for (const auto& [s_most, name] : names) {
    Result op{"scaling", "  " + block.label + " op", name};
    op.timing = summarize({s_most});
    op.extra["share"] = s_most / total_most;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const auto found = block.runs[i].op_s.find(name);
      op.extra["s_at_" + std::to_string(counts[i])] = found == block.runs[i].op_s.end() ? 0.0 : found->second;
    }
    const auto at_one = one.op_s.find(name);
    if (at_one != one.op_s.end() && s_most > 0) {
      op.extra["speedup"] = at_one->second / s_most;
      op.extra["efficiency"] = op.extra["speedup"] / counts.back();
    }
    context.add(op);
  }
}

}  // namespace

void scaling_suite(Context& context) {
  const std::vector<int> cpus = allowed_cpus();
  const std::vector<int> counts = thread_counts(std::min<int>(context.machine.threads, static_cast<int>(cpus.size())));
  std::vector<double> peaks;
  const models::FluxConfig flux = models::FluxConfig::flux1_dev();
  const models::WanConfig wan = models::WanConfig::wan21_1_3b();

  // Weights and inputs once (f32, as the `blocks` suite's f32 rows); a device per thread count.
  models::ParameterTable table;
  models::FluxDoubleBlock double_block;
  models::FluxSingleBlock single_block;
  models::WanBlock wan_block;
  double_block.declare(table, 0, flux);
  single_block.declare(table, 0, flux);
  models::make_random_parameters(table, DType::f32, 5, 0.02f);
  models::ParameterTable wan_table;
  wan_block.declare(wan_table, 0, wan);
  models::make_random_parameters(wan_table, DType::f32, 7, 0.02f);

  std::vector<BlockScaling> blocks = {
      {"flux double 1024+256 x3072 f32", {}}, {"flux single 1024+256 x3072 f32", {}}, {"wan 4680+512 x1536 f32", {}}};
  for (int t : counts) {
    confine_process({cpus.begin(), cpus.begin() + t});
    ops::AttentionTuner::global().clear();
    peaks.push_back(fma_peak_gflops_at(t));
    DeviceProfile profile = builtin_cpu_profile();
    profile.cube_threads = t;
    profile.vector_threads = t;
    Device device(profile, {.trace = true});
    const Stream s = device.default_stream();
    const FluxBlockInputsF32 f = flux_block_inputs(flux, s);
    const models::FluxBlockInputs flux_shared{f.silu_temb, f.rope, {1, 32, 32}};
    const models::BlockState state{f.hidden, f.context_states};
    blocks[0].runs.push_back(measure_traced(
        device, [&] { return double_block.forward(state, flux_shared, {}, s).hidden; }, context.repeats));
    blocks[1].runs.push_back(measure_traced(
        device, [&] { return single_block.forward(state, flux_shared, {}, s).hidden; }, context.repeats));
    const WanBlockInputsF32 w = wan_block_inputs(wan);
    const models::WanBlockInputs wan_shared{w.context_states, w.timestep_proj, w.rope, {kWanFrames, kWanHeight, kWanWidth}};
    blocks[2].runs.push_back(measure_traced(
        device,
        [&] {
          return wan_block.forward({w.hidden, {}}, wan_shared, {}, s).hidden;
        },
        context.repeats));
    std::fprintf(stderr, "scaling: %d core%s done (FMA peak %.1f GFLOP/s)\n", t, t == 1 ? "" : "s", peaks.back());
  }
  confine_process(cpus);
  ops::AttentionTuner::global().clear();  // picks made on fewer cores are no one else's
  for (const BlockScaling& block : blocks) report(context, block, counts, peaks);
}

}  // namespace cubevec::bench
