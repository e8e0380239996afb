#include "base/interrupt.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "base/output_file.h"

namespace cubevec {

namespace {

std::atomic<int> received{0};
std::atomic<bool> draining{false};  // serve_signals_by_draining() was called
std::atomic<int> stop_received{0};  // a stop signal in that mode
int wake_pipe[2] = {-1, -1};        // the handler writes a byte per signal; the watchdog reads them
static_assert(std::atomic<int>::is_always_lock_free, "the handler may only touch lock-free atomics");

constexpr int kGraceMs = 3000;  // how long a run may take to reach its next kernel launch or step

extern "C" void on_interrupt(int signal) {
  int expected = 0;
  if (draining.load()) {
    stop_received.compare_exchange_strong(expected, signal);
    // The watchdog counts the signals: the first starts the drain, the second ends the process.
    const char byte = 2;
    if (wake_pipe[1] >= 0) (void)!::write(wake_pipe[1], &byte, 1);
    return;
  }
  received.compare_exchange_strong(expected, signal);
  const char byte = 1;
  if (wake_pipe[1] >= 0) (void)!::write(wake_pipe[1], &byte, 1);  // async-signal-safe
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGPIPE: return "SIGPIPE";
    default: return "signal " + std::to_string(signal);
  }
}

// Waits for a signal; if the run has not stopped kGraceMs later (one kernel can run for minutes)
// or a second signal comes, removes the output temporaries and ends the process.
void watchdog() {
  char byte = 0;
  while (::read(wake_pipe[0], &byte, 1) < 0) {
  }
  if (byte == 2) {  // a service draining: wait for a second signal
    while (::read(wake_pipe[0], &byte, 1) < 0) {
    }
    const int signal = stop_received.load();
    remove_live_temporaries();
    std::fprintf(stderr, "error: %s again while draining; ending at once\n", signal_name(signal).c_str());
    std::fflush(stderr);
    ::_exit(128 + signal);
  }
  pollfd second{wake_pipe[0], POLLIN, 0};
  (void)::poll(&second, 1, kGraceMs);
  const int signal = received.load();
  remove_live_temporaries();
  std::fprintf(stderr, "error: interrupted by %s; the run was ended%s and no output was written\n", signal_name(signal).c_str(),
               second.revents ? " at the second signal" : " (it did not reach a stopping point within 3 s)");
  std::fflush(stderr);
  ::_exit(128 + signal);
}

}  // namespace

Interrupted::Interrupted(int signal)
    : Error("interrupted by " + signal_name(signal) + "; the run stopped and no output was written"), signal_(signal) {}

void install_interrupt_handlers() {
  if (wake_pipe[0] >= 0) return;
  if (::pipe2(wake_pipe, O_CLOEXEC) != 0) return;  // no watchdog: the checks alone still stop the run
  std::thread(watchdog).detach();
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (const int signal : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaction(signal, &action, nullptr);
  // A file-size limit (ulimit -f) would kill the process mid-write, leaving its temporaries;
  // ignored, the write fails with EFBIG and the output code reports it and cleans up.
  std::signal(SIGXFSZ, SIG_IGN);
}

void serve_signals_by_draining() {
  draining = true;
  std::signal(SIGPIPE, SIG_IGN);
}

int stop_signal() { return stop_received.load(); }

int interrupt_signal() { return received.load(std::memory_order_relaxed); }

void throw_if_interrupted() {
  if (const int signal = interrupt_signal()) throw Interrupted(signal);
}

}  // namespace cubevec
