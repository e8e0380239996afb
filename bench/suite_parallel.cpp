// Suite `parallel`, run as `mpirun --bind-to none -np 2 cubevec-bench parallel`: every multi-device
// strategy on the same work, 2 ranks with one Cube and one Vector thread each against one process
// whose units have every core, running alone while the other rank sleeps in a barrier.
//
// The work: 2 denoising steps of the shipped tinyflux at 256 x 256 (1024 image tokens, 6 heads of
// 32) for Ulysses, ring, tensor parallel and CFG parallel (CFG fused on one process, one branch per
// rank on two), and the patch-parallel decode of a Wan-style VAE (3 latent frames of 32 x 32).
//
// What a 2-core machine can show: the communication each strategy adds (collectives, bytes, the
// seconds the communication unit is busy), and whether splitting the work costs more than it
// saves when both ranks share the machine's memory and cores. What it cannot show: a speedup from
// more hardware. Both sides have the same two cores, so a ratio near 1 is the best possible; the
// transfers are shared-memory copies, far faster than a real interconnect relative to compute.
// Simulate mode (`cubevec t2i --simulate --ranks N`) models the cards instead.
#include <sched.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>

#include "bench/harness.h"
#include "models/autoencoder_kl_wan.h"
#include "models/parameters.h"
#include "models/tiny_text_encoder.h"
#include "parallel/mpi_runtime.h"
#include "parallel/plan.h"
#include "pipelines/flux_t2i.h"
#include "pipelines/patch_parallel_vae.h"
#include "pipelines/stages/sequence_parallel.h"
#include "pipelines/stages/tensor_parallel.h"

namespace cubevec::bench {

namespace {

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
}

DeviceProfile profile_with(int threads) {
  DeviceProfile p = builtin_cpu_profile();
  p.cube_threads = p.vector_threads = threads;
  return p;
}

struct Measured {
  Timing timing;
  double flops = 0;                                    // per run, this rank's kernels
  double comm_s = 0, comm_bytes = 0, collectives = 0;  // per run
};

// Times `run` (after one warm-up) between barriers, so each figure covers the slowest rank. With
// `alone`, only rank 0 runs it and the other ranks wait (sleeping) at the barriers.
Measured measure(const parallel::Communicator& world, Device& device, int repeats, bool alone, const std::function<void()>& run) {
  const bool runs = !alone || world.rank() == 0;
  device.reset_stats();
  std::vector<double> seconds;
  for (int r = 0; r <= repeats; ++r) {
    world.barrier("bench.parallel.start");
    const auto t0 = std::chrono::steady_clock::now();
    if (runs) {
      run();
      device.synchronize();
    }
    world.barrier("bench.parallel.end");
    if (r > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  Measured m;
  m.timing = summarize(seconds);
  const DeviceStats stats = device.stats();
  const auto comm = static_cast<std::size_t>(Unit::comm);
  const double runs_done = repeats + 1;
  for (const double f : stats.flops_per_unit) m.flops += f / runs_done;
  m.comm_s = stats.measured_busy_s[comm] / runs_done;
  m.comm_bytes = stats.bytes_per_unit[comm] / runs_done;
  m.collectives = static_cast<double>(stats.kernels_per_unit[comm]) / runs_done;
  return m;
}

// The one-process row and the 2-rank row of one case; the rate is the one-process run's flops over
// each median (the same work), against the FMA peak rank 0 measured alone.
void report(Context& context, double peak_gflops, const std::string& name, int cores, const std::string& strategy, const Measured& alone,
            const Measured& shared) {
  Result base{"parallel", name, "1 process x " + std::to_string(cores) + " cores"};
  base.timing = alone.timing;
  base.gflops = alone.flops / alone.timing.median_s / 1e9;
  base.peak_fraction = base.gflops / peak_gflops;
  context.add(base);
  Result row{"parallel", name, strategy + ", 2 ranks x 1 core"};
  row.timing = shared.timing;
  row.gflops = alone.flops / shared.timing.median_s / 1e9;
  row.peak_fraction = row.gflops / peak_gflops;
  row.extra["speedup"] = alone.timing.median_s / shared.timing.median_s;
  row.extra["speedup_min"] = alone.timing.min_s / shared.timing.min_s;
  row.extra["comm_s"] = shared.comm_s;
  row.extra["comm_fraction"] = shared.comm_s / shared.timing.median_s;
  row.extra["comm_mib"] = shared.comm_bytes / (1 << 20);
  row.extra["collectives"] = shared.collectives;
  context.add(row);
}

struct FluxCase {
  std::string name;
  parallel::ParallelDegrees degrees;
};

}  // namespace

void parallel_suite(Context& context) {
  if (!parallel::launched_by_mpirun() || parallel::world_size() != 2) {
    std::fprintf(stderr, "parallel: skipped: run it as `mpirun --bind-to none -np 2 cubevec-bench parallel` (2 ranks)\n");
    return;
  }
  const parallel::Communicator world = parallel::Communicator::world();
  const bool reporter = world.rank() == 0;
  const int cores = usable_cpus();
  // Both ranks measured the machine at once before the suites; rank 0 measures it again alone.
  double peak_gflops = 0;
  world.barrier("bench.parallel.machine");
  if (reporter) peak_gflops = measure_machine().fma_peak_gflops;
  world.barrier("bench.parallel.machine.done");
  if (reporter) {
    std::fprintf(stderr,
                 "parallel: rank 0 may run on %d core(s) (FMA peak %.1f GFLOP/s measured alone); the one-process baseline uses "
                 "%d Cube + %d Vector thread(s), each rank 1 + 1\n",
                 cores, peak_gflops, cores, cores);
    if (cores < 2)
      std::fprintf(stderr, "parallel: mpirun bound this rank to one core, so the baseline cannot use two: start it with --bind-to none\n");
  }

  // Tinyflux at 256 x 256, 2 steps, from one prompt (with CFG for the CFG-parallel case).
  const std::string dir = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";
  const std::vector<FluxCase> cases = {
      {"ulysses x2", {.ulysses = 2}}, {"ring x2", {.ring = 2}}, {"tp x2", {.tp = 2}}, {"cfg-parallel x2", {.cfg = 2}}};
  for (const FluxCase& c : cases) {
    // Loaded again for the 2-rank run: tensor parallel cuts the weights, which must not have been
    // packed for the Cube unit yet.
    pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(dir);
    const parallel::ParallelGroups groups = parallel::make_parallel_groups(c.degrees);
    pipelines::T2IOptions o;
    o.width = o.height = 256;
    o.steps = 2;
    o.cfg = c.degrees.cfg == 2 ? pipelines::CfgMode::fused : pipelines::CfgMode::off;
    const auto denoise = [&](Device& device, pipelines::StageList* stages) {
      const auto encoder = models::TinyTextEncoder::load(dir, device.default_stream());
      const models::PromptEmbeddings prompt = encoder->encode("a red circle on a blue background"), negative = encoder->encode("");
      return [&pipeline, &o, &device, stages, prompt, negative] {
        pipelines::T2ITimings timings;
        pipeline.denoise(prompt, o.cfg == pipelines::CfgMode::off ? nullptr : &negative, o, device, {}, timings, stages);
      };
    };
    Measured alone, shared;
    {
      Device device(profile_with(cores));
      alone = measure(world, device, context.repeats, true, denoise(device, nullptr));
    }
    {
      Device device(profile_with(1));
      pipeline = pipelines::FluxT2IPipeline::load(dir);
      pipelines::StageList stages;
      if (c.degrees.sequence() > 1) stages.add(std::make_unique<pipelines::SequenceParallelStage>(groups.ulysses, groups.ring));
      if (c.degrees.tp > 1)
        stages.add(std::make_unique<pipelines::TensorParallelStage>(groups.tp, pipeline.transformer().tensor_parallel_plan()));
      stages.after_load(pipeline.mutable_transformer().mutable_parameters());
      if (c.degrees.cfg == 2) o.cfg_parallel = groups.cfg;
      shared = measure(world, device, context.repeats, false, denoise(device, &stages));
    }
    if (reporter)
      report(context, peak_gflops, "tinyflux 256x256 2 steps" + std::string(c.degrees.cfg == 2 ? " cfg" : ""), cores, c.name, alone,
             shared);
  }

  // The patch-parallel Wan VAE: base width 32, 3 latent frames of 32 x 32 (9 frames of 256 x 256).
  {
    models::AutoencoderKLWanConfig config;
    config.base_dim = 32;
    models::AutoencoderKLWan vae(config);
    models::make_random_parameters(vae.parameters(), DType::f32, 3, 0.1f);
    models::ParameterTable inputs;
    Tensor z;
    inputs.add("z", {1, config.z_dim, 3, 32, 32}, &z);
    models::make_random_parameters(inputs, DType::f32, 4, 1.0f);
    Measured alone, shared;
    {
      Device device(profile_with(cores));
      alone = measure(world, device, context.repeats, true, [&] { vae.decode(z, {}, device.default_stream()); });
    }
    {
      Device device(profile_with(1));
      const pipelines::PatchParallelRows rows(world, z.size(3));
      models::WanDecodeOptions options;
      options.rows = &rows;
      shared = measure(world, device, context.repeats, false, [&] { vae.decode(z, options, device.default_stream()); });
    }
    if (reporter) report(context, peak_gflops, "wan vae (width 32) 9x256x256", cores, "vae-parallel x2", alone, shared);
  }
}

}  // namespace cubevec::bench
