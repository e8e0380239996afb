#include "parallel/mpi_runtime.h"

#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "base/error.h"

namespace cubevec::parallel {

namespace {

constexpr int kFailureTag = 7001;

std::mutex g_mutex;  // MPI start/stop and the failure channel
bool g_started = false;
bool g_finalized = false;
MPI_Comm g_failure_comm = MPI_COMM_NULL;  // a duplicate of the world, used for failure notices only
std::optional<std::string> g_failure;     // the first failure another rank announced
bool g_announced = false;
std::atomic<double> g_timeout_s{600.0};
std::atomic<bool> g_abandoned{false};

// Takes one failure notice off the wire, if one is waiting: "rank R failed: message". Under g_mutex.
std::optional<std::string> take_notice() {
  int flag = 0;
  MPI_Status status;
  MPI_Iprobe(MPI_ANY_SOURCE, kFailureTag, g_failure_comm, &flag, &status);
  if (!flag) return std::nullopt;
  int count = 0;
  MPI_Get_count(&status, MPI_CHAR, &count);
  std::string text(static_cast<std::size_t>(std::max(count, 0)), '\0');
  MPI_Recv(text.data(), count, MPI_CHAR, status.MPI_SOURCE, kFailureTag, g_failure_comm, MPI_STATUS_IGNORE);
  return "rank " + std::to_string(status.MPI_SOURCE) + " failed: " + text;
}

}  // namespace

bool launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(name); v && *v) return true;
  return false;
}

void ensure_mpi() {
  std::lock_guard lock(g_mutex);
  if (g_started) return;
  if (g_finalized) throw Error("MPI was already stopped in this process; it cannot be started again");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) throw Error("MPI_Init_thread failed");
    if (provided < MPI_THREAD_MULTIPLE)
      throw Error("this MPI library does not support MPI_THREAD_MULTIPLE, which cubevec's communication unit needs");
  }
  // Errors come back as return codes (each call is checked), not as an abort of the whole job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_dup(MPI_COMM_WORLD, &g_failure_comm);
  g_started = true;
}

bool mpi_running() {
  std::lock_guard lock(g_mutex);
  return g_started && !g_finalized;
}

int world_rank() {
  if (!mpi_running()) return 0;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  if (!mpi_running()) return 1;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

void set_collective_timeout(double seconds) {
  if (!std::isfinite(seconds) || seconds <= 0)
    throw Error("collective timeout: expected a positive number of seconds, got " + number_for_message(seconds));
  g_timeout_s = seconds;
}

double collective_timeout() { return g_timeout_s; }

void announce_failure(const std::string& message) {
  std::vector<MPI_Request> requests;
  static std::string sent;  // must outlive the sends
  {
    std::lock_guard lock(g_mutex);
    if (!g_started || g_finalized || g_announced) return;
    g_announced = true;
    int rank = 0, size = 1;
    MPI_Comm_rank(g_failure_comm, &rank);
    MPI_Comm_size(g_failure_comm, &size);
    sent = message.substr(0, 4000);
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      requests.emplace_back();
      MPI_Isend(sent.data(), static_cast<int>(sent.size()), MPI_CHAR, peer, kFailureTag, g_failure_comm, &requests.back());
    }
  }
  // Short messages go out eagerly; give them a moment, then leave whatever did not (the receiver
  // is gone or stuck, and its own timeout will name this rank).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int done = 0;
  while (!requests.empty() && std::chrono::steady_clock::now() < deadline) {
    MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (MPI_Request& r : requests)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
}

std::optional<std::string> received_failure() {
  std::lock_guard lock(g_mutex);
  if (g_failure || !g_started || g_finalized) return g_failure;
  g_failure = take_notice();
  return g_failure;
}

void mark_collective_abandoned() { g_abandoned = true; }

void finalize(int exit_status) {
  {
    std::lock_guard lock(g_mutex);
    if (!g_started || g_finalized) return;
  }
  if (exit_status != 0 || g_abandoned) {
    // MPI_Finalize waits for every rank; one stuck in a collective this rank left would hold it
    // forever. The watchdog ends the process instead.
    std::thread([exit_status] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      _exit(exit_status != 0 ? exit_status : 1);
    }).detach();
  }
  std::lock_guard lock(g_mutex);
  // Notices nobody read (this rank finished first) are taken off the wire before MPI stops.
  while (take_notice()) {
  }
  MPI_Comm_free(&g_failure_comm);
  MPI_Finalize();
  g_finalized = true;
}

}  // namespace cubevec::parallel
