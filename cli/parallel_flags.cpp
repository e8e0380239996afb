#include "cli/parallel_flags.h"

#include "parallel/mpi_runtime.h"

namespace cubevec::cli {

parallel::ParallelGroups ParallelFlags::resolve() const {
  parallel::set_collective_timeout(comm_timeout_s);
  return parallel::make_parallel_groups(degrees);
}

std::shared_ptr<ParallelFlags> add_parallel_flags(CLI::App& command, bool cfg_parallel) {
  auto flags = std::make_shared<ParallelFlags>();
  command.add_option("--ulysses", flags->degrees.ulysses,
                     "Ulysses sequence parallel over this many ranks (mpirun -np N; must divide the head count)");
  if (cfg_parallel)
    command.add_option("--cfg-parallel", flags->degrees.cfg, "2: the conditional and unconditional CFG branches on different ranks");
  command.add_option("--comm-timeout", flags->comm_timeout_s,
                     "Seconds a rank waits for the others in one collective before it stops with an error (default 600)");
  return flags;
}

}  // namespace cubevec::cli
