#include "parallel/communicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>

#include "parallel/mpi_runtime.h"
#include "base/error.h"

namespace cubevec::parallel {

namespace {

constexpr int kArrivalTag = 7101;
constexpr int kDataTag = 7102;
constexpr std::size_t kWhatLength = 240;

// What a rank tells each peer before an operation.
struct Arrival {
  uint64_t sequence = 0;  // operations this pair has exchanged before
  uint64_t bytes = 0;     // what the sender sends to (or contributes for) the receiver
  char what[kWhatLength] = {};
};

void check(int code, const char* call, const std::string& what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(std::string(call) + " failed in " + what + ": " + std::string(text, static_cast<std::size_t>(length)));
}

int mpi_count(std::size_t bytes, const std::string& what) {
  if (bytes > static_cast<std::size_t>(INT_MAX))
    throw Error(what + ": " + std::to_string(bytes) + " bytes in one message; MPI counts stop at 2^31 - 1");
  return static_cast<int>(bytes);
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

}  // namespace

struct Communicator::State {
  std::string name;
  MPI_Comm comm = MPI_COMM_NULL;  // MPI_COMM_NULL: one rank, MPI not running
  bool owned = false;             // made by split: freed here
  int rank = 0;
  int size = 1;
  std::vector<int> world_ranks{0};
  std::mutex mutex;                // one operation at a time
  std::vector<uint64_t> sequence;  // per member: operations exchanged with it so far
  std::string broken;              // why an earlier operation left this communicator unusable
  bool simulated = false;          // size ranks modelled in one process: no transfer can happen

  ~State() {
    if (owned && comm != MPI_COMM_NULL && mpi_running()) MPI_Comm_free(&comm);
  }

  std::string describe() const { return "communicator '" + name + "' (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")"; }

  // Without MPI there is nobody to talk to: only a one-rank communicator can do its operations
  // (as local copies); a simulated one has no data to move.
  bool local(const std::string& what) const {
    if (comm != MPI_COMM_NULL) return false;
    if (simulated || size > 1) throw Error(what + " on " + describe() + ": a simulated communicator models transfers but moves no data");
    return true;
  }

  void refuse_if_broken(const std::string& what) const {
    if (!broken.empty()) throw Error(what + " on " + describe() + ": refused, an earlier operation failed (" + broken + ")");
  }

  // Waits for non-blocking requests. `peer_of[i]` is the member requests[i] waits on (-1: all of
  // them, a collective). On a failure notice from another rank or after the timeout, throws naming
  // `what` and, for a timeout, the members that did not arrive.
  void wait(std::vector<MPI_Request>& requests, const std::vector<int>& peer_of, const std::string& what, bool arrival) {
    const auto start = std::chrono::steady_clock::now();
    const double timeout = collective_timeout();
    for (int round = 0;; ++round) {
      bool all_done = true;
      for (MPI_Request& r : requests) {
        if (r == MPI_REQUEST_NULL) continue;
        int done = 0;
        check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test", what);
        all_done = all_done && done;
      }
      if (all_done) return;
      std::string failure;
      if (const auto notice = received_failure()) {
        failure = what + " on " + describe() + " stopped: " + *notice;
      } else if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout) {
        std::vector<int> missing;
        for (std::size_t i = 0; i < requests.size(); ++i)
          if (requests[i] != MPI_REQUEST_NULL && peer_of[i] >= 0 && std::find(missing.begin(), missing.end(), peer_of[i]) == missing.end())
            missing.push_back(peer_of[i]);
        std::sort(missing.begin(), missing.end());
        failure = what + " on " + describe() + ": " +
                  (arrival && !missing.empty() ? "rank(s) " + rank_list(missing) + " did not arrive"
                                               : std::string("the transfer did not complete")) +
                  " within " + number_for_message(timeout) + " s";
      }
      if (!failure.empty()) {
        abandon(requests, peer_of);
        broken = failure;
        throw Error(failure);
      }
      if (round < 2000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
  }

  // Gives up on requests still pending: point-to-point ones are cancelled and freed; a collective
  // in flight cannot be, so MPI must not be waited for at the end (finalize's watchdog).
  static void abandon(std::vector<MPI_Request>& requests, const std::vector<int>& peer_of) {
    for (std::size_t i = 0; i < requests.size(); ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      if (peer_of[i] < 0) {
        mark_collective_abandoned();
        continue;
      }
      MPI_Cancel(&requests[i]);
      MPI_Request_free(&requests[i]);
    }
  }

  // The arrival check with `peers`; `bytes_to[i]` is what this rank sends peers[i]. Returns what
  // each peer says it sends here.
  std::vector<uint64_t> handshake(const std::vector<int>& peers, const std::vector<uint64_t>& bytes_to, const std::string& what) {
    refuse_if_broken(what);
    const std::size_t n = peers.size();
    std::vector<Arrival> out(n), in(n);
    std::vector<MPI_Request> requests(2 * n, MPI_REQUEST_NULL);
    std::vector<int> peer_of(2 * n, -1);
    for (std::size_t i = 0; i < n; ++i) {
      const int peer = peers[i];
      out[i].sequence = sequence[static_cast<std::size_t>(peer)]++;
      out[i].bytes = bytes_to[i];
      std::strncpy(out[i].what, what.c_str(), kWhatLength - 1);
      peer_of[i] = peer;
      peer_of[n + i] = peer;
      check(MPI_Irecv(&in[i], sizeof(Arrival), MPI_BYTE, peer, kArrivalTag, comm, &requests[i]), "MPI_Irecv", what);
      check(MPI_Isend(&out[i], sizeof(Arrival), MPI_BYTE, peer, kArrivalTag, comm, &requests[n + i]), "MPI_Isend", what);
    }
    wait(requests, peer_of, what, /*arrival=*/true);
    std::vector<uint64_t> bytes_from(n);
    for (std::size_t i = 0; i < n; ++i) {
      in[i].what[kWhatLength - 1] = '\0';
      if (in[i].sequence != out[i].sequence || std::strncmp(in[i].what, out[i].what, kWhatLength) != 0) {
        broken = "ranks disagree";
        throw Error("ranks disagree on " + describe() + ": this rank is at operation #" + std::to_string(out[i].sequence) + " '" +
                    out[i].what + "', rank " + std::to_string(peers[i]) + " at #" + std::to_string(in[i].sequence) + " '" + in[i].what +
                    "'");
      }
      bytes_from[i] = in[i].bytes;
    }
    return bytes_from;
  }

  std::vector<int> others() const {
    std::vector<int> peers;
    for (int r = 0; r < size; ++r)
      if (r != rank) peers.push_back(r);
    return peers;
  }
};

Communicator Communicator::world() {
  auto state = std::make_shared<State>();
  state->name = "world";
  if (launched_by_mpirun()) {
    ensure_mpi();
    // A communicator of its own, so that nothing left over from another one (a rank that arrived
    // after a timeout) can be mistaken for this one's traffic.
    state->comm = MPI_COMM_WORLD;  // for describe() while waiting
    MPI_Comm_rank(MPI_COMM_WORLD, &state->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &state->size);
    MPI_Comm own = MPI_COMM_NULL;
    std::vector<MPI_Request> request(1, MPI_REQUEST_NULL);
    check(MPI_Comm_idup(MPI_COMM_WORLD, &own, &request[0]), "MPI_Comm_idup", "making the world communicator");
    state->wait(request, {-1}, "making the world communicator", false);
    state->comm = own;
    state->owned = true;
    MPI_Comm_set_errhandler(own, MPI_ERRORS_RETURN);
    state->world_ranks.resize(static_cast<std::size_t>(state->size));
    for (int r = 0; r < state->size; ++r) state->world_ranks[static_cast<std::size_t>(r)] = r;
  }
  state->sequence.assign(static_cast<std::size_t>(state->size), 0);
  return Communicator(std::move(state));
}

Communicator Communicator::simulated(const std::string& name, int size, int rank) {
  if (size < 1 || rank < 0 || rank >= size)
    throw Error("a simulated communicator needs size >= 1 and 0 <= rank < size, got size " + std::to_string(size) + ", rank " +
                std::to_string(rank));
  auto state = std::make_shared<State>();
  state->name = name;
  state->size = size;
  state->rank = rank;
  state->simulated = true;
  state->world_ranks.resize(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) state->world_ranks[static_cast<std::size_t>(r)] = r;
  state->sequence.assign(static_cast<std::size_t>(size), 0);
  return Communicator(std::move(state));
}

Communicator Communicator::split(const std::string& name, int color) const {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  auto made = std::make_shared<State>();
  made->name = name;
  if (s.local("split into '" + name + "'")) {
    made->world_ranks = s.world_ranks;
    made->sequence.assign(1, 0);
    return Communicator(std::move(made));
  }
  const std::string what = "split into '" + name + "'";
  const std::vector<int> peers = s.others();
  s.handshake(peers, std::vector<uint64_t>(peers.size(), 0), what);
  check(MPI_Comm_split(s.comm, color, s.rank, &made->comm), "MPI_Comm_split", what);
  made->owned = true;
  MPI_Comm_set_errhandler(made->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(made->comm, &made->rank);
  MPI_Comm_size(made->comm, &made->size);
  MPI_Group group, world_group;
  MPI_Comm_group(made->comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  std::vector<int> members(static_cast<std::size_t>(made->size));
  for (int r = 0; r < made->size; ++r) members[static_cast<std::size_t>(r)] = r;
  made->world_ranks.resize(members.size());
  MPI_Group_translate_ranks(group, made->size, members.data(), world_group, made->world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  made->sequence.assign(static_cast<std::size_t>(made->size), 0);
  return Communicator(std::move(made));
}

int Communicator::rank() const { return state_->rank; }
int Communicator::size() const { return state_->size; }
const std::string& Communicator::name() const { return state_->name; }
int Communicator::world_rank_of(int member) const {
  if (member < 0 || member >= state_->size)
    throw Error(describe() + ": no member " + std::to_string(member) + "; members are 0 to " + std::to_string(state_->size - 1));
  return state_->world_ranks[static_cast<std::size_t>(member)];
}
std::string Communicator::describe() const { return state_->describe(); }

namespace {

void require_counts(const std::vector<std::size_t>& counts, int size, const char* which, const std::string& what,
                    const std::string& where) {
  if (counts.size() != static_cast<std::size_t>(size))
    throw Error(what + " on " + where + ": " + std::to_string(counts.size()) + " " + which + " counts for " + std::to_string(size) +
                " members");
}

// Byte counts as MPI's int counts and displacements.
void to_mpi(const std::vector<std::size_t>& counts, std::vector<int>& mpi_counts, std::vector<int>& displs, const std::string& what) {
  mpi_counts.resize(counts.size());
  displs.resize(counts.size());
  std::size_t total = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    mpi_counts[r] = mpi_count(counts[r], what);
    displs[r] = mpi_count(total, what);
    total += counts[r];
  }
  mpi_count(total, what);
}

}  // namespace

void Communicator::all_gather(const void* in, void* out, const std::vector<std::size_t>& bytes, const std::string& what) const {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  require_counts(bytes, s.size, "byte", what, s.describe());
  const std::size_t mine = bytes[static_cast<std::size_t>(s.rank)];
  if (s.local(what)) {
    std::memmove(out, in, mine);
    return;
  }
  const std::vector<int> peers = s.others();
  const std::vector<uint64_t> from = s.handshake(peers, std::vector<uint64_t>(peers.size(), mine), what);
  for (std::size_t i = 0; i < peers.size(); ++i)
    if (from[i] != bytes[static_cast<std::size_t>(peers[i])]) {
      s.broken = "byte counts differ";
      throw Error(what + " on " + s.describe() + ": rank " + std::to_string(peers[i]) + " contributes " + std::to_string(from[i]) +
                  " bytes, this rank expects " + std::to_string(bytes[static_cast<std::size_t>(peers[i])]));
    }
  std::vector<int> counts, displs;
  to_mpi(bytes, counts, displs, what);
  std::vector<MPI_Request> request(1, MPI_REQUEST_NULL);
  check(MPI_Iallgatherv(in, counts[static_cast<std::size_t>(s.rank)], MPI_BYTE, out, counts.data(), displs.data(), MPI_BYTE, s.comm,
                        &request[0]),
        "MPI_Iallgatherv", what);
  s.wait(request, {-1}, what, false);
}

void Communicator::all_to_all(const void* in, const std::vector<std::size_t>& send_bytes, void* out,
                              const std::vector<std::size_t>& recv_bytes, const std::string& what) const {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  require_counts(send_bytes, s.size, "send", what, s.describe());
  require_counts(recv_bytes, s.size, "receive", what, s.describe());
  const auto me = static_cast<std::size_t>(s.rank);
  if (send_bytes[me] != recv_bytes[me])
    throw Error(what + " on " + s.describe() + ": sends itself " + std::to_string(send_bytes[me]) + " bytes but expects " +
                std::to_string(recv_bytes[me]));
  if (s.local(what)) {
    std::memmove(out, in, send_bytes[0]);
    return;
  }
  const std::vector<int> peers = s.others();
  std::vector<uint64_t> to(peers.size());
  for (std::size_t i = 0; i < peers.size(); ++i) to[i] = send_bytes[static_cast<std::size_t>(peers[i])];
  const std::vector<uint64_t> from = s.handshake(peers, to, what);
  for (std::size_t i = 0; i < peers.size(); ++i)
    if (from[i] != recv_bytes[static_cast<std::size_t>(peers[i])]) {
      s.broken = "byte counts differ";
      throw Error(what + " on " + s.describe() + ": rank " + std::to_string(peers[i]) + " sends " + std::to_string(from[i]) +
                  " bytes, this rank expects " + std::to_string(recv_bytes[static_cast<std::size_t>(peers[i])]));
    }
  std::vector<int> scounts, sdispls, rcounts, rdispls;
  to_mpi(send_bytes, scounts, sdispls, what);
  to_mpi(recv_bytes, rcounts, rdispls, what);
  std::vector<MPI_Request> request(1, MPI_REQUEST_NULL);
  check(MPI_Ialltoallv(in, scounts.data(), sdispls.data(), MPI_BYTE, out, rcounts.data(), rdispls.data(), MPI_BYTE, s.comm, &request[0]),
        "MPI_Ialltoallv", what);
  s.wait(request, {-1}, what, false);
}

void Communicator::all_reduce_sum(float* data, std::size_t count, const std::string& what) const {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (s.local(what)) return;
  const std::vector<int> peers = s.others();
  const uint64_t bytes = count * sizeof(float);
  const std::vector<uint64_t> from = s.handshake(peers, std::vector<uint64_t>(peers.size(), bytes), what);
  for (std::size_t i = 0; i < peers.size(); ++i)
    if (from[i] != bytes) {
      s.broken = "element counts differ";
      throw Error(what + " on " + s.describe() + ": rank " + std::to_string(peers[i]) + " sums " + std::to_string(from[i] / sizeof(float)) +
                  " elements, this rank " + std::to_string(count));
    }
  std::vector<MPI_Request> request(1, MPI_REQUEST_NULL);
  check(MPI_Iallreduce(MPI_IN_PLACE, data, mpi_count(count, what), MPI_FLOAT, MPI_SUM, s.comm, &request[0]), "MPI_Iallreduce", what);
  s.wait(request, {-1}, what, false);
}

void Communicator::send_recv(const void* send, std::size_t send_bytes, int dest, void* recv, std::size_t recv_bytes, int source,
                             const std::string& what) const {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  for (const int member : {dest, source})
    if (member < 0 || member >= s.size)
      throw Error(what + " on " + s.describe() + ": no member " + std::to_string(member) + "; members are 0 to " +
                  std::to_string(s.size - 1));
  if (s.comm == MPI_COMM_NULL && s.size > 1) s.local(what);  // throws: simulated
  if (dest == s.rank || source == s.rank) {
    if (dest != source || send_bytes != recv_bytes)
      throw Error(what + " on " + s.describe() + ": a rank can only exchange with itself both ways and the same byte count");
    std::memmove(recv, send, send_bytes);
    return;
  }
  std::vector<int> peers{dest};
  std::vector<uint64_t> to{send_bytes};
  if (source != dest) {
    peers.push_back(source);
    to.push_back(0);
  }
  const std::vector<uint64_t> from = s.handshake(peers, to, what);
  const uint64_t incoming = source == dest ? from[0] : from[1];
  if (incoming != recv_bytes) {
    s.broken = "byte counts differ";
    throw Error(what + " on " + s.describe() + ": rank " + std::to_string(source) + " sends " + std::to_string(incoming) +
                " bytes, this rank expects " + std::to_string(recv_bytes));
  }
  std::vector<MPI_Request> requests(2, MPI_REQUEST_NULL);
  check(MPI_Irecv(recv, mpi_count(recv_bytes, what), MPI_BYTE, source, kDataTag, s.comm, &requests[0]), "MPI_Irecv", what);
  check(MPI_Isend(send, mpi_count(send_bytes, what), MPI_BYTE, dest, kDataTag, s.comm, &requests[1]), "MPI_Isend", what);
  s.wait(requests, {source, dest}, what, false);
}

void Communicator::barrier(const std::string& label) const {
  const std::string what = "barrier '" + label + "'";
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (s.local(what)) return;
  const std::vector<int> peers = s.others();
  s.handshake(peers, std::vector<uint64_t>(peers.size(), 0), what);
}

}  // namespace cubevec::parallel
