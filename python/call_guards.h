// What every call into the module checks and counts, shared by the pipelines (module.cpp) and the
// layers (layers.cpp): the interpreter's exit, a forked child, and the errors that become
// ValueError.
#pragma once

#include <atomic>

#include "base/error.h"

namespace cubevec::python {

// A bad argument (its value, shape or dtype; the message names it): raised as ValueError. Every
// other cubevec::Error is raised as cubevec.Error.
struct BadArgument : cubevec::Error {
  using cubevec::Error::Error;
};

// Calls running in C++ right now, and the interpreter's exit: at exit the module cancels running
// generations and waits for them (with the GIL released) before Python finalizes, so no thread
// (a daemon thread in a call) tries to take the GIL back from a finalized interpreter, which ends
// the process with std::terminate.
extern std::atomic<int> active_calls;
extern std::atomic<bool> exiting;
struct ActiveCall {
  ActiveCall() { ++active_calls; }
  ~ActiveCall() { --active_calls; }
  ActiveCall(const ActiveCall&) = delete;
  ActiveCall& operator=(const ActiveCall&) = delete;
};

// A call that starts after the exit hook ran would take the GIL back from a finalizing interpreter.
void require_not_exiting();

// TBB's threads do not survive fork(): a forked child that calls in would hang; it gets an error
// naming the process that started them instead.
void require_not_forked();

}  // namespace cubevec::python
