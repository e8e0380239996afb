// MPI in this process: started on first use, stopped once at the end of main, and the one channel
// by which a failing rank tells the others, so that no rank waits forever for a rank that died.
//
// Note [How a multi-rank run fails]
// Every wait for another rank (parallel/communicator.cpp) polls the failure channel and has a
// deadline. A rank whose work fails announces its message to every rank before it exits; a rank
// waiting in a collective then raises "rank R failed: ..." naming the collective it was in. A rank
// that never arrives (hung, or killed) is named by the collective's timeout. finalize() has a
// watchdog of its own, so even a rank left with a collective in flight exits.
#pragma once

#include <optional>
#include <string>

namespace cubevec::parallel {

// True when this process was started by mpirun (Open MPI's or PMIx's environment is set).
bool launched_by_mpirun();

// Starts MPI (MPI_THREAD_MULTIPLE) if it is not running; throws if this build's MPI cannot.
void ensure_mpi();
bool mpi_running();
int world_rank();  // 0 and 1 when MPI is not running
int world_size();

// How long a rank waits for the others in one collective before it gives up (seconds; default
// 600). Throws unless finite and positive.
void set_collective_timeout(double seconds);
double collective_timeout();

// Tells every other rank that this one failed with `message` (at most once per process; a no-op
// without MPI or with one rank).
void announce_failure(const std::string& message);
// A failure another rank announced, if one has arrived: "rank R failed: message".
std::optional<std::string> received_failure();

// Marks that a collective may still be in flight (a timeout left it), so finalize() must not wait.
void mark_collective_abandoned();

// Stops MPI if it was started. After a failure, waits at most a few seconds for the other ranks
// and then ends the process with `exit_status` rather than hang.
void finalize(int exit_status);

}  // namespace cubevec::parallel
