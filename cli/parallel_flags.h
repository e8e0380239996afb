// The multi-device flags of the commands that run a transformer: --ulysses U, --cfg-parallel C,
// --comm-timeout S, and for simulate mode --ranks N. Run under `mpirun -np N` with U x C = N; rank
// 0 writes the outputs. With --simulate, one process models the N cards.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

#include "parallel/plan.h"

namespace cubevec::cli {

struct ParallelFlags {
  parallel::ParallelDegrees degrees;
  double comm_timeout_s = 600;
  int ranks = 0;  // --ranks N: cards modelled in one process (simulate mode only); 0: not given

  // Checks the flags against the ranks mpirun started (or, simulated, --ranks) before any work and
  // makes the groups.
  parallel::ParallelGroups resolve(bool simulate = false) const;
};

// `cfg_parallel`: whether the command has CFG branches to spread (t2i, t2v; not forward).
std::shared_ptr<ParallelFlags> add_parallel_flags(CLI::App& command, bool cfg_parallel);

}  // namespace cubevec::cli
