// Suite `serve`: what `cubevec serve --instances N` buys over N separate servers. Each layout runs
// as real `cubevec serve` processes on loopback, driven by a closed-loop client of this process
// (2 clients per instance, each sending its next request when the last one returns) with the
// README's tinyflux prompt at 64x64 and 8 steps:
//   - one process with --instances 1, 2, 4: one copy of the weights;
//   - 2 and 4 processes with --instances 1 each: a copy per process.
// Per layout: throughput (requests/s), the median and p95 latency, the resident memory of all its
// processes together after the run, and x_one = its throughput over one instance's. Then the leak
// check: 1,000 requests (--repeats x 200) against one process with --instances 2, its resident
// memory after the first 100 and after the last (growth_mib), and the failed requests (must be 0).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "bench/harness.h"

namespace cubevec::bench {

namespace {

const std::string kServeBody =
    R"({"prompt": "a large red circle in the center on a blue background", "num_inference_steps": 8, "seed": 1})";

// A `cubevec serve` child on a free loopback port.
class ServerProcess {
 public:
  ServerProcess(int instances, const std::string& err_path) : err_path_(err_path) {
    const std::string model = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";
    std::vector<std::string> args = {CUBEVEC_BINARY, "serve", "--model",     model, "--port", "0", "--instances", std::to_string(instances),
                                     "--max-queue",  "64",    "--max-steps", "200"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      std::FILE* err = std::freopen(err_path_.c_str(), "w", stderr);
      if (!err) ::_exit(127);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const std::regex listening("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    for (int i = 0; i < 600 && port_ == 0; ++i) {
      std::ifstream in(err_path_);
      std::stringstream text;
      text << in.rdbuf();
      const std::string s = text.str();
      std::smatch match;
      if (std::regex_search(s, match, listening)) port_ = std::stoi(match[1]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (port_ == 0) throw std::runtime_error("cubevec serve did not start; see " + err_path_);
  }
  ~ServerProcess() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  double resident_mib() const {
    std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
    return 0;
  }

 private:
  std::string err_path_;
  pid_t pid_ = -1;
  int port_ = 0;
};

struct LoadResult {
  std::vector<double> latencies;
  double seconds = 0;
  int failed = 0;
};

// `clients` threads, each sending `per_client` requests in turn, to the servers round-robin.
LoadResult closed_loop(const std::vector<int>& ports, int clients, int per_client) {
  LoadResult result;
  std::mutex mutex;
  std::atomic<int> failed{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", ports[static_cast<std::size_t>(c) % ports.size()]);
      client.set_read_timeout(600, 0);
      for (int i = 0; i < per_client; ++i) {
        const auto start = std::chrono::steady_clock::now();
        const auto r = client.Post("/v1/images/generations", kServeBody, "application/json");
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (!r || r->status != 200) {
          ++failed;
          continue;
        }
        std::lock_guard lock(mutex);
        result.latencies.push_back(s);
      }
    });
  for (std::thread& t : threads) t.join();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.failed = failed;
  return result;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

}  // namespace

void serve_suite(Context& context) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("cubevec_bench_serve_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  struct Layout {
    int processes, instances;
  };
  const std::vector<Layout> layouts = {{1, 1}, {1, 2}, {1, 4}, {2, 1}, {4, 1}};
  double one_instance_rps = 0;
  int process_number = 0;
  for (const Layout& layout : layouts) {
    std::vector<std::unique_ptr<ServerProcess>> servers;
    std::vector<int> ports;
    for (int p = 0; p < layout.processes; ++p) {
      servers.push_back(
          std::make_unique<ServerProcess>(layout.instances, (dir / ("serve" + std::to_string(process_number++) + ".err")).string()));
      ports.push_back(servers.back()->port());
    }
    const int clients = 2 * layout.processes * layout.instances;
    closed_loop(ports, clients, 1);  // warm-up: packing and tuning in every instance
    const LoadResult load = closed_loop(ports, clients, context.repeats * 2);
    double resident = 0;
    for (const auto& s : servers) resident += s->resident_mib();
    const double rps = static_cast<double>(load.latencies.size()) / load.seconds;
    if (layout.processes == 1 && layout.instances == 1) one_instance_rps = rps;
    Result row{"serve", "tinyflux 64x64 8 steps",
               std::to_string(layout.processes) + " process x " + std::to_string(layout.instances) + " inst"};
    row.timing = summarize(load.latencies);
    row.extra["throughput_rps"] = rps;
    row.extra["p95_ms"] = percentile(load.latencies, 0.95) * 1e3;
    row.extra["resident_mib"] = resident;
    row.extra["x_one"] = one_instance_rps > 0 ? rps / one_instance_rps : 0;
    row.extra["failed"] = load.failed;
    context.add(row);
  }

  // The leak check: resident memory after 100 requests and after 1,000 (with --repeats 5).
  {
    ServerProcess server(2, (dir / "leak.err").string());
    const int total = context.repeats * 200;
    const LoadResult first = closed_loop({server.port()}, 4, 25);
    const double after_first = server.resident_mib();
    const LoadResult rest = closed_loop({server.port()}, 4, (total - 100) / 4);
    const double after_all = server.resident_mib();
    Result row{"serve", "leak check " + std::to_string(total) + " requests", "1 process x 2 inst"};
    std::vector<double> all = first.latencies;
    all.insert(all.end(), rest.latencies.begin(), rest.latencies.end());
    row.timing = summarize(all);
    row.extra["resident_after_100_mib"] = after_first;
    row.extra["resident_after_all_mib"] = after_all;
    row.extra["growth_mib"] = after_all - after_first;
    row.extra["failed"] = first.failed + rest.failed;
    context.add(row);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace cubevec::bench
