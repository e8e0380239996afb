// The PyTorch 1.13 baselines the suites compare with in the same run (bench/torch_*.py, run by
// Debian's /usr/bin/python3): each prints one JSON object on stdout (torch_bench_common.py).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace cubevec::bench {

// The JSON of bench/<script_name> run with --threads and --repeats, or null when it cannot run
// (no python3-torch): the suite then reports its own rows with a note.
nlohmann::json run_torch(const std::string& script_name, int threads, int repeats, const std::string& extra_args = "");

}  // namespace cubevec::bench
