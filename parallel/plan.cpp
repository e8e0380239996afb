#include "parallel/plan.h"

#include "parallel/mpi_runtime.h"
#include "tensor/error.h"

namespace cubevec::parallel {

std::string ParallelDegrees::describe() const {
  return "--ulysses " + std::to_string(ulysses) + " x --cfg-parallel " + std::to_string(cfg);
}

ParallelGroups make_parallel_groups(const ParallelDegrees& degrees) {
  if (degrees.ulysses < 1 || degrees.ulysses > 4096)
    throw Error("--ulysses must be from 1 to 4096 ranks, got " + std::to_string(degrees.ulysses));
  if (degrees.cfg != 1 && degrees.cfg != 2)
    throw Error("--cfg-parallel must be 1 or 2 (one rank per CFG branch), got " + std::to_string(degrees.cfg));
  // Checked on every rank alone, before any collective: each says what is wrong itself.
  if (launched_by_mpirun()) ensure_mpi();
  const int ranks = world_size();
  if (degrees.ranks() != ranks) {
    const std::string need = degrees.describe() + " = " + std::to_string(degrees.ranks()) + " rank(s)";
    if (ranks == 1)
      throw Error(need + ", but this run has one: start it with mpirun -np " + std::to_string(degrees.ranks()));
    throw Error(need + ", but mpirun started " + std::to_string(ranks) + "; the product of the degrees must be the rank count");
  }
  const Communicator world = Communicator::world();
  ParallelGroups groups{degrees, world, world, world};
  const int rank = groups.world.rank();
  groups.ulysses = groups.world.split("ulysses", rank / degrees.ulysses);
  groups.cfg = groups.world.split("cfg", rank % degrees.ulysses);
  return groups;
}

}  // namespace cubevec::parallel
