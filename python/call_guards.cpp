#include "python/call_guards.h"

#include <unistd.h>

#include <string>

namespace cubevec::python {

std::atomic<int> active_calls{0};
std::atomic<bool> exiting{false};

namespace {
std::atomic<pid_t> threads_owner{0};  // the process whose threads the library started
}  // namespace

void require_not_exiting() {
  if (exiting) throw cubevec::Error("the interpreter is exiting: no new cubevec calls");
}

void require_not_forked() {
  const pid_t owner = threads_owner.load();
  if (owner != 0 && owner != ::getpid())
    throw cubevec::Error("cubevec's threads were started in process " + std::to_string(owner) +
                         " and do not survive fork(): use cubevec (its pipelines and layers) in a process started fresh "
                         "(multiprocessing's 'spawn' or 'forkserver' start method)");
  threads_owner = ::getpid();
}

}  // namespace cubevec::python
