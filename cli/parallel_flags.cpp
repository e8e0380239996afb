#include "cli/parallel_flags.h"
#include "cli/range_flag.h"

#include "parallel/mpi_runtime.h"
#include "base/error.h"

namespace cubevec::cli {

parallel::ParallelGroups ParallelFlags::resolve(bool simulate) const {
  if (!(comm_timeout_s > 0)) throw Error("--comm-timeout must be a positive number of seconds, got " + number_for_message(comm_timeout_s));
  parallel::set_collective_timeout(comm_timeout_s);
  if (ranks != 0 && !simulate)
    throw Error("--ranks models that many cards in one process and needs --simulate; a real run takes its ranks from mpirun -np");
  if (simulate && parallel::world_size() == 1) return parallel::make_simulated_groups(degrees, ranks != 0 ? ranks : degrees.ranks());
  return parallel::make_parallel_groups(degrees);
}

parallel::ParallelGroups ParallelFlags::resolve_generation(bool simulate, pipelines::CfgMode cfg,
                                                           std::optional<parallel::Communicator>& cfg_parallel) const {
  parallel::ParallelGroups groups = resolve(simulate);
  if (groups.degrees.cfg == 2) {
    if (cfg == pipelines::CfgMode::off)
      throw Error("--cfg-parallel 2 runs the two CFG branches on two ranks, but --cfg is off: give --cfg fused or streams");
    cfg_parallel = groups.cfg;
  }
  return groups;
}

std::optional<parallel::Communicator> ParallelFlags::vae_group(const parallel::ParallelGroups& groups, bool simulate) const {
  if (!vae_parallel) return std::nullopt;
  if (simulate) throw Error("--vae-parallel shares the VAE decode, but --simulate models the transformer only (no VAE decode runs)");
  if (groups.world.size() == 1)
    throw Error("--vae-parallel shares the VAE decode among the ranks of the run, but this run has one: start it with mpirun -np N");
  return groups.world;
}

std::shared_ptr<ParallelFlags> add_parallel_flags(CLI::App& command, bool cfg_parallel) {
  auto flags = std::make_shared<ParallelFlags>();
  command.add_option("--ulysses", flags->degrees.ulysses,
                     "Ulysses sequence parallel over this many ranks (mpirun -np N; must divide the head count)");
  command.add_option("--ring", flags->degrees.ring,
                     "Ring attention over this many ranks: each keeps a span of the tokens and K/V pass around the ring");
  command.add_option("--tp", flags->degrees.tp,
                     "Tensor parallel over this many ranks: each holds heads / T of every block's heads and MLP units (must divide them)");
  if (cfg_parallel)
    command.add_option("--cfg-parallel", flags->degrees.cfg, "2: the conditional and unconditional CFG branches on different ranks");
  if (cfg_parallel)
    command.add_option("--ranks", flags->ranks, "With --simulate: model a run on this many cards (the product of the degrees)")
        ->check(in_range(1, 4096));
  if (cfg_parallel)
    command.add_flag("--vae-parallel", flags->vae_parallel,
                     "Every rank shares the VAE decode: Flux's tiles dealt round-robin, Wan's rows in bands with halo exchange");
  command.add_option("--comm-timeout", flags->comm_timeout_s,
                     "Seconds a rank waits for the others in one collective before it stops with an error (default 600)");
  return flags;
}

}  // namespace cubevec::cli
