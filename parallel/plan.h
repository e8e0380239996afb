// The parallel layout of one run: how many ranks each strategy takes, checked against the ranks
// mpirun started before any work, and the communicator of each strategy's group.
#pragma once

#include <string>

#include "parallel/communicator.h"

namespace cubevec::parallel {

struct ParallelDegrees {
  int ulysses = 1;  // Ulysses sequence parallel: ranks sharing the tokens by an all-to-all over the heads
  int ring = 1;     // ring attention: ranks sharing the tokens by passing K/V around a ring
  int cfg = 1;      // CFG parallel: 1, or 2 (one CFG branch per rank)
  int tp = 1;       // tensor parallel: ranks sharing every block's heads and MLP units
  int ranks() const { return ulysses * ring * cfg * tp; }
  int sequence() const { return ulysses * ring; }  // ranks sharing one forward's tokens
  // "--ulysses 2 x --ring 1 x --cfg-parallel 2 x --tp 1", for messages.
  std::string describe() const;
};

// Ranks are laid out cfg-major, then ring, then Ulysses, then tensor parallel:
//   world rank = ((cfg index * ring + ring index) * ulysses + ulysses index) * tp + tp index,
// so the groups that talk most (tensor parallel's all-reduces after every block's Linears, then
// Ulysses' all-to-alls) are neighbouring ranks (on one node, as the NPU's HCCS links are). The tokens go to the ulysses x ring ranks in the order (ring index,
// ulysses index): a ring member holds one contiguous span, which its Ulysses group shares.
struct ParallelGroups {
  ParallelDegrees degrees;
  Communicator world, ulysses, ring, cfg, tp;
};

// Throws, naming the flags, unless every degree is at least 1, cfg is 1 or 2, and the product is
// the number of ranks this run has; then makes the groups (collective over the world).
ParallelGroups make_parallel_groups(const ParallelDegrees& degrees);

// Simulate mode: the groups of a run on `ranks` modelled cards as rank 0 sees them (the ranks are
// symmetric, so one models them all); no MPI. The same checks as above, against `ranks`.
ParallelGroups make_simulated_groups(const ParallelDegrees& degrees, int ranks);

}  // namespace cubevec::parallel
