// The `cubevec` command line: subcommands, and one place that turns every failure into
// "error: ..." on stderr with exit status 1 (user error) or 2 (internal error). Under mpirun every
// rank runs the same command; a failing rank says which it is and tells the others (see Note [How
// a multi-rank run fails] in parallel/mpi_runtime.h), and MPI is stopped on every path.
#include <cstdio>
#include <filesystem>
#include <exception>
#include <new>
#include <string>

#include "cli/command_line.h"
#include "cli/error_line.h"
#include "ops/gemm/tuner.h"
#include "parallel/mpi_runtime.h"
#include "base/error.h"
#include "base/interrupt.h"

using cubevec::cli::one_line;

namespace {

// Prints "error: ..." (naming the rank when there are several) and tells the other ranks.
void report(const std::string& message) {
  const std::string line = one_line(message);
  if (cubevec::parallel::world_size() > 1) {
    std::fprintf(stderr, "error: rank %d: %s\n", cubevec::parallel::world_rank(), line.c_str());
    cubevec::parallel::announce_failure(line);
  } else {
    std::fprintf(stderr, "error: %s\n", line.c_str());
  }
}

int run(int argc, char** argv) {
  cubevec::cli::CommandLine command_line;
  try {
    if (cubevec::parallel::launched_by_mpirun()) cubevec::parallel::ensure_mpi();
    const cubevec::cli::ParsedCommand parsed = command_line.parse(argc, argv);
    if (!parsed.run) return parsed.exit_status;
    // The kernel-forcing variables are read before any work: a bad value fails at once, and a run
    // whose AMX kernels are on the tile model (CUBEVEC_AMX_MODEL, a checking aid) says so.
    cubevec::ops::gemm::check_kernel_environment();
    if (cubevec::ops::gemm::amx_model_on())
      std::fprintf(stderr,
                   "note: CUBEVEC_AMX_MODEL=1: AMX kernels run on a plain C++ model of the tiles (to check the AMX code paths; far "
                   "slower), and nothing measured is saved to the tuning file\n");
    return parsed.run();
  } catch (const cubevec::Interrupted& e) {
    report(e.what());
    return e.exit_status();
  } catch (const cubevec::Error& e) {
    report(e.what());
    // A failure after a stop signal (a kernel that was waiting for the tuning file's lock) ends
    // the run as the signal does.
    if (const int signal = cubevec::interrupt_signal()) return 128 + signal;
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the user gave could not be examined (a symlink loop, no permission): the OS's reason
    // and the path, as every other input error.
    report(e.path1().string() + ": " + e.code().message());
    return 1;
  } catch (const std::bad_alloc&) {
    report(
        "out of memory: the request needs more memory than this machine gives (use a smaller size, fewer frames or "
        "--simulate with smaller settings)");
    return 1;
  } catch (const std::exception& e) {
    report(std::string("internal error: ") + e.what());
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  cubevec::install_interrupt_handlers();
  const int status = run(argc, argv);
  cubevec::parallel::finalize(status);
  return status;
}
