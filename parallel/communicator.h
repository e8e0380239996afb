// Communicator: a group of ranks that exchange data (the world, or the sub-group of one parallel
// dimension: ulysses, ring, cfg, tp), over MPI.
//
// Every operation first checks that each rank it involves arrived at the same operation: a short
// message to each peer carries the operation's sequence number, its description and the byte count
// meant for that peer. So ranks that call different collectives, or the same in a different order,
// get an error naming both calls instead of exchanging garbage, and a rank that never arrives is
// named when the wait passes collective_timeout() (see Note [How a multi-rank run fails]).
//
// Operations block and are meant for the device's communication unit (parallel/collectives.h
// launches them as its kernels); one communicator serializes its own operations.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace cubevec::parallel {

class Communicator {
 public:
  // Every rank (starts MPI if needed). With MPI not launched by mpirun: one rank.
  static Communicator world();

  // A communicator of `size` ranks in which this process is `rank`, with nothing behind it: for
  // simulate mode, where one process models a run on many cards (ranks are symmetric) and the
  // communication kernels are priced but never run. Any transfer through it is an error.
  static Communicator simulated(const std::string& name, int size, int rank = 0);

  // The members with the same `color` form a new communicator called `name`, ranked in this one's
  // order. Collective over this communicator.
  Communicator split(const std::string& name, int color) const;

  int rank() const;
  int size() const;
  const std::string& name() const;
  int world_rank_of(int member) const;
  // "communicator 'ulysses' (rank 1 of 2)", for messages.
  std::string describe() const;

  // Member r contributes `bytes[r]` (uneven counts allowed); `out` gets them all, in rank order.
  // `what` names the call and must be the same on every member; a member whose count differs from
  // `bytes` is an error naming it.
  void all_gather(const void* in, void* out, const std::vector<std::size_t>& bytes, const std::string& what) const;
  // `send_bytes[j]` bytes of `in` (laid out in rank order) go to member j; `out` gets
  // `recv_bytes[j]` from each member j, in rank order (checked against what j sends).
  void all_to_all(const void* in, const std::vector<std::size_t>& send_bytes, void* out, const std::vector<std::size_t>& recv_bytes,
                  const std::string& what) const;
  // Element-wise sum over the members, in place.
  void all_reduce_sum(float* data, std::size_t count, const std::string& what) const;
  // Sends `send_bytes` to member `dest` while receiving from member `source` into `recv` (a ring
  // step); the sizes are checked against what the peers say they send.
  void send_recv(const void* send, std::size_t send_bytes, int dest, void* recv, std::size_t recv_bytes, int source,
                 const std::string& what) const;
  // Every member has arrived at this barrier (named `label` in errors).
  void barrier(const std::string& label) const;

  struct State;

 private:
  explicit Communicator(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

}  // namespace cubevec::parallel
