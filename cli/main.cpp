// The `cubevec` command line: subcommands, and one place that turns every failure into
// "error: ..." on stderr with exit status 1 (user error) or 2 (internal error).
#include <cstdio>
#include <filesystem>
#include <exception>
#include <new>
#include <string>

#include "cli/command_line.h"
#include "cli/error_line.h"
#include "tensor/error.h"
#include "tensor/interrupt.h"

using cubevec::cli::one_line;

int main(int argc, char** argv) {
  cubevec::install_interrupt_handlers();
  cubevec::cli::CommandLine command_line;
  try {
    const cubevec::cli::ParsedCommand parsed = command_line.parse(argc, argv);
    return parsed.run ? parsed.run() : parsed.exit_status;
  } catch (const cubevec::Interrupted& e) {
    std::fprintf(stderr, "error: %s\n", one_line(e.what()).c_str());
    return e.exit_status();
  } catch (const cubevec::Error& e) {
    std::fprintf(stderr, "error: %s\n", one_line(e.what()).c_str());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the user gave could not be examined (a symlink loop, no permission): the OS's reason
    // and the path, as every other input error.
    std::fprintf(stderr, "error: %s: %s\n", one_line(e.path1().string()).c_str(), one_line(e.code().message()).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory: the request needs more memory than this machine gives (use a smaller size, fewer "
                         "frames or --simulate with smaller settings)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: internal error: %s\n", one_line(e.what()).c_str());
    return 2;
  }
}
