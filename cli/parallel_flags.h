// The multi-device flags of the commands that run a transformer: --ulysses U, --ring R,
// --cfg-parallel C, --tp T, --vae-parallel, --comm-timeout S, and for simulate mode --ranks N. Run
// under `mpirun -np N` with U x R x C x T = N; rank 0 writes the outputs. With --simulate, one process models the N cards.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>

#include "models/tensor_parallel_plan.h"
#include "parallel/plan.h"
#include "pipelines/guidance.h"
#include "pipelines/stage_plan.h"

namespace cubevec::cli {

struct ParallelFlags {
  parallel::ParallelDegrees degrees;
  double comm_timeout_s = 600;
  int ranks = 0;              // --ranks N: cards modelled in one process (simulate mode only); 0: not given
  bool vae_parallel = false;  // --vae-parallel: every rank shares the VAE decode (t2i, t2v)

  // Checks the flags against the ranks mpirun started (or, simulated, --ranks) before any work and
  // makes the groups.
  parallel::ParallelGroups resolve(bool simulate = false) const;
  // resolve() for t2i / t2v: with --cfg-parallel 2 the CFG group goes to `cfg_parallel` (the
  // pipeline's option), which needs CFG on.
  parallel::ParallelGroups resolve_generation(bool simulate, pipelines::CfgMode cfg,
                                              std::optional<parallel::Communicator>& cfg_parallel) const;
  // With --vae-parallel, the group that shares the VAE decode: every rank of the run. Throws for a
  // run with one rank, or in simulate mode (which models the transformer, not the VAE).
  std::optional<parallel::Communicator> vae_group(const parallel::ParallelGroups& groups, bool simulate) const;
};

// `cfg_parallel`: whether the command has CFG branches to spread (t2i, t2v; not forward).
std::shared_ptr<ParallelFlags> add_parallel_flags(CLI::App& command, bool cfg_parallel);

}  // namespace cubevec::cli
