#include "parallel/plan.h"

#include "parallel/mpi_runtime.h"
#include "base/error.h"

namespace cubevec::parallel {

std::string ParallelDegrees::describe() const {
  return "--ulysses " + std::to_string(ulysses) + " x --ring " + std::to_string(ring) + " x --cfg-parallel " + std::to_string(cfg) +
         " x --tp " + std::to_string(tp);
}

namespace {

void check_degrees(const ParallelDegrees& degrees) {
  if (degrees.ulysses < 1 || degrees.ulysses > 4096)
    throw Error("--ulysses must be from 1 to 4096 ranks, got " + std::to_string(degrees.ulysses));
  if (degrees.ring < 1 || degrees.ring > 4096) throw Error("--ring must be from 1 to 4096 ranks, got " + std::to_string(degrees.ring));
  if (degrees.tp < 1 || degrees.tp > 4096) throw Error("--tp must be from 1 to 4096 ranks, got " + std::to_string(degrees.tp));
  if (static_cast<int64_t>(degrees.ulysses) * degrees.ring * degrees.tp > 4096)
    throw Error("--ulysses x --ring x --tp must be at most 4096 ranks, got " + std::to_string(degrees.ulysses) + " x " +
                std::to_string(degrees.ring) + " x " + std::to_string(degrees.tp));
  if (degrees.cfg != 1 && degrees.cfg != 2)
    throw Error("--cfg-parallel must be 1 or 2 (one rank per CFG branch), got " + std::to_string(degrees.cfg));
}

std::string ranks_needed(const ParallelDegrees& degrees) {
  return degrees.describe() + " = " + std::to_string(degrees.ranks()) + " rank(s)";
}

}  // namespace

ParallelGroups make_parallel_groups(const ParallelDegrees& degrees) {
  check_degrees(degrees);
  // Checked on every rank alone, before any collective: each says what is wrong itself.
  if (launched_by_mpirun()) ensure_mpi();
  const int ranks = world_size();
  if (degrees.ranks() != ranks) {
    if (ranks == 1)
      throw Error(ranks_needed(degrees) + ", but this run has one: start it with mpirun -np " + std::to_string(degrees.ranks()));
    throw Error(ranks_needed(degrees) + ", but mpirun started " + std::to_string(ranks) +
                "; the product of the degrees must be the rank count");
  }
  const Communicator world = Communicator::world();
  ParallelGroups groups{degrees, world, world, world, world, world};
  const int rank = groups.world.rank();
  // Each group: the ranks that differ only in its own index, which has `stride` in the layout above
  // and `size` values; its color is the rank with that index zeroed.
  const auto group = [&](const char* name, int stride, int size) {
    return groups.world.split(name, (rank / (stride * size)) * stride + rank % stride);
  };
  const int t = degrees.tp, u = degrees.ulysses, r = degrees.ring;
  groups.tp = group("tp", 1, t);
  groups.ulysses = group("ulysses", t, u);
  groups.ring = group("ring", t * u, r);
  groups.cfg = group("cfg", t * u * r, degrees.cfg);
  return groups;
}

ParallelGroups make_simulated_groups(const ParallelDegrees& degrees, int ranks) {
  check_degrees(degrees);
  if (degrees.ranks() != ranks)
    throw Error(ranks_needed(degrees) + ", but --ranks is " + std::to_string(ranks) +
                "; the product of the degrees must be the rank count");
  return {degrees,
          Communicator::simulated("world", ranks),
          Communicator::simulated("ulysses", degrees.ulysses),
          Communicator::simulated("ring", degrees.ring),
          Communicator::simulated("cfg", degrees.cfg),
          Communicator::simulated("tp", degrees.tp)};
}

}  // namespace cubevec::parallel
