// The multi-device flags of the commands that run a transformer: --ulysses U, --cfg-parallel C and
// --comm-timeout S. Run under `mpirun -np N` with U x C = N; rank 0 writes the outputs.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>

#include "parallel/plan.h"

namespace cubevec::cli {

struct ParallelFlags {
  parallel::ParallelDegrees degrees;
  double comm_timeout_s = 600;

  // Checks the flags against the ranks mpirun started (an error before any work) and makes the
  // groups.
  parallel::ParallelGroups resolve() const;
};

// `cfg_parallel`: whether the command has CFG branches to spread (t2i, t2v; not forward).
std::shared_ptr<ParallelFlags> add_parallel_flags(CLI::App& command, bool cfg_parallel);

}  // namespace cubevec::cli
