#include "tensor/interrupt.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <string>

namespace cubevec {

namespace {

std::atomic<int> received{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler may only touch lock-free atomics");

extern "C" void on_interrupt(int signal) {
  if (received.exchange(signal) != 0) ::_exit(128 + signal);  // the second one: stop now
}

std::string signal_name(int signal) {
  return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "signal " + std::to_string(signal);
}

}  // namespace

Interrupted::Interrupted(int signal)
    : Error("interrupted by " + signal_name(signal) + "; the run stopped and no output was written"), signal_(signal) {}

void install_interrupt_handlers() {
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int interrupt_signal() { return received.load(std::memory_order_relaxed); }

void throw_if_interrupted() {
  if (const int signal = interrupt_signal()) throw Interrupted(signal);
}

}  // namespace cubevec
