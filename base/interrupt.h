// Stopping a run on SIGINT / SIGTERM / SIGHUP / SIGPIPE without leaving anything behind: the
// handler only records the signal; the device checks it before each kernel launch
// (device/stream.cpp) and the denoising loop before each step, and throw Interrupted. Unwinding
// removes every uncommitted output temporary (base/output_file.h) and the command exits 128 +
// the signal (130, 143, ...) with a message. A run inside one long kernel (a huge convolution) is
// ended by a watchdog thread 3 s after the signal, or at a second signal: it removes the
// temporaries itself and exits with the same status.
#pragma once

#include "base/error.h"

namespace cubevec {

class Interrupted : public Error {
 public:
  explicit Interrupted(int signal);
  int signal() const { return signal_; }
  int exit_status() const { return 128 + signal_; }

 private:
  int signal_;
};

// Installs the handlers and the watchdog (the cubevec binary does, at start).
void install_interrupt_handlers();
// The signal received, or 0.
int interrupt_signal();
// Throws Interrupted when a signal was received.
void throw_if_interrupted();

// For a long-running service (`cubevec serve`): from now on SIGINT / SIGTERM / SIGHUP no longer stop
// the work in progress (no Interrupted is thrown); they are counted for the service to poll, which
// drains and exits. A second signal ends the process at once through the watchdog. SIGPIPE (a client
// that went away) is ignored: the write fails with EPIPE instead.
void serve_signals_by_draining();
// The first stop signal received since serve_signals_by_draining(), or 0.
int stop_signal();

}  // namespace cubevec
