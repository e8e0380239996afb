// The parallel layout of one run: how many ranks each strategy takes, checked against the ranks
// mpirun started before any work, and the communicator of each strategy's group.
#pragma once

#include <string>

#include "parallel/communicator.h"

namespace cubevec::parallel {

struct ParallelDegrees {
  int ulysses = 1;  // Ulysses sequence parallel: ranks sharing the tokens
  int cfg = 1;      // CFG parallel: 1, or 2 (one CFG branch per rank)
  int ranks() const { return ulysses * cfg; }
  // "--ulysses 2 x --cfg-parallel 2", for messages.
  std::string describe() const;
};

// Ranks are laid out cfg-major: world rank = cfg index * ulysses + ulysses index, so the ranks of a
// Ulysses group are neighbours (on one node, as the NPU's HCCS links are).
struct ParallelGroups {
  ParallelDegrees degrees;
  Communicator world, ulysses, cfg;
};

// Throws, naming the flags, unless every degree is at least 1, cfg is 1 or 2, and the product is
// the number of ranks this run has; then makes the groups (collective over the world).
ParallelGroups make_parallel_groups(const ParallelDegrees& degrees);

// Simulate mode: the groups of a run on `ranks` modelled cards as rank 0 sees them (the ranks are
// symmetric, so one models them all); no MPI. The same checks as above, against `ranks`.
ParallelGroups make_simulated_groups(const ParallelDegrees& degrees, int ranks);

}  // namespace cubevec::parallel
