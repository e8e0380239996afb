// Suites `serve` and `serve-flux`: what `cubevec serve --instances N` buys over N separate servers,
// and what `--packed-cache` buys those processes. Each layout runs as real `cubevec serve`
// processes on loopback, driven by a closed-loop client of this process (2 clients per instance,
// each sending its next request when the last one returns):
//   - one process with --instances 1, 2, 4: one copy of the weights and panels;
//   - 2 and 4 processes with --instances 1 each: a copy of the panels per process;
//   - 2 and 4 processes mapping one --packed-cache file: the panels once, in the page cache.
// Per layout: throughput (requests/s), the median and p95 latency, the resident memory of its
// processes after the run, summed as RSS (shared pages counted in every process) and as PSS (each
// shared page split among its processes: what the machine holds), and x_one = its throughput over
// one instance's. Then one process with --instances 2 and --trace: the share of the traced span the
// Cube and Vector units are busy, busy at once, and the two instances' kernels run at once (where
// the instances' throughput comes from; CUBEVEC_SERVE_TRACE=FILE keeps the Chrome trace). Then the
// start of a process (fork to listening, and its first request) packing its panels, writing the
// cache, and mapping it.
// `serve` runs tinyflux (64x64, 8 steps) and a leak check: 1,000 requests (--repeats x 200) against
// one process with --instances 2, its memory after the first 100 and after the last, and the failed
// requests (must be 0). `serve-flux` runs a model of FLUX.1's width (bench/flux_dev_shaped.h:
// 3072 wide, 2 + 2 blocks, bf16, 512x512, 2 steps), written once to $CUBEVEC_FLUX_WIDTH_DIR or the
// temp folder (about 2 GB).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "bench/flux_dev_shaped.h"
#include "bench/harness.h"

namespace cubevec::bench {

namespace {

const std::string kServeBody =
    R"({"prompt": "a large red circle in the center on a blue background", "num_inference_steps": 8, "seed": 1})";

// A `cubevec serve` child on a free loopback port.
class ServerProcess {
 public:
  ServerProcess(const std::string& model, int instances, const std::vector<std::string>& extra, const std::string& err_path)
      : err_path_(err_path) {
    std::vector<std::string> args = {CUBEVEC_BINARY, "serve", "--model",     model, "--port", "0", "--instances", std::to_string(instances),
                                     "--max-queue",  "64",    "--max-steps", "200"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    pid_ = ::fork();
    if (pid_ == 0) {
      std::FILE* err = std::freopen(err_path_.c_str(), "w", stderr);
      if (!err) ::_exit(127);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const std::regex listening("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    for (int i = 0; i < 120000 && port_ == 0; ++i) {  // up to 10 minutes: a large model loads and packs first
      std::smatch match;
      const std::string text = err();
      if (std::regex_search(text, match, listening)) port_ = std::stoi(match[1]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (i % 200 == 0 && ::waitpid(pid_, nullptr, WNOHANG) == pid_) break;
    }
    start_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (port_ == 0) throw std::runtime_error("cubevec serve did not start; see " + err_path_ + ":\n" + err());
  }
  ~ServerProcess() { stop(); }
  // SIGTERM and wait: the server drains and writes what it writes at exit (--trace).
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  double start_seconds() const { return start_s_; }  // fork to "listening"
  std::string err() const {
    std::ifstream in(err_path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // The process's resident set (VmRSS) and proportional set size (Pss), MiB.
  double resident_mib() const { return kib_field("/proc/" + std::to_string(pid_) + "/status", "VmRSS:") / 1024.0; }
  double proportional_mib() const { return kib_field("/proc/" + std::to_string(pid_) + "/smaps_rollup", "Pss:") / 1024.0; }

 private:
  static double kib_field(const std::string& path, const std::string& name) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);)
      if (line.rfind(name, 0) == 0) return std::stod(line.substr(name.size()));
    return 0;
  }
  std::string err_path_;
  pid_t pid_ = -1;
  int port_ = 0;
  double start_s_ = 0;
};

struct LoadResult {
  std::vector<double> latencies;
  double seconds = 0;
  int failed = 0;
};

// `clients` threads, each sending `per_client` requests (`body`) in turn, to the servers round-robin.
LoadResult closed_loop(const std::vector<int>& ports, const std::string& body, int clients, int per_client) {
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
        const auto r = client.Post("/v1/images/generations", body, "application/json");
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

namespace {

// One served model and how the suite drives it.
struct ServedCase {
  std::string model, label, body;
  std::vector<std::string> flags;  // --dtype ...
  int per_client = 1;              // timed requests per client after the warm-up
};

struct Layout {
  int processes, instances;
  bool packed_cache;
};

void run_layouts(Context& context, const ServedCase& served, const std::filesystem::path& dir) {
  const std::vector<Layout> layouts = {{1, 1, false}, {1, 2, false}, {1, 4, false}, {2, 1, false},
                                       {4, 1, false}, {2, 1, true},  {4, 1, true}};
  const std::string cache = (dir / "packed").string();
  double one_instance_rps = 0;
  int process_number = 0;
  for (const Layout& layout : layouts) {
    std::vector<std::string> flags = served.flags;
    if (layout.packed_cache) flags.insert(flags.end(), {"--packed-cache", cache});
    std::vector<std::unique_ptr<ServerProcess>> servers;
    std::vector<int> ports;
    for (int p = 0; p < layout.processes; ++p) {
      // The first cached process writes the file (if an earlier layout did not); the rest map it.
      servers.push_back(std::make_unique<ServerProcess>(served.model, layout.instances, flags,
                                                        (dir / ("serve" + std::to_string(process_number++) + ".err")).string()));
      ports.push_back(servers.back()->port());
    }
    const int clients = 2 * layout.processes * layout.instances;
    closed_loop(ports, served.body, clients, 1);  // warm-up: packing and tuning in every instance
    const LoadResult load = closed_loop(ports, served.body, clients, served.per_client);
    double resident = 0, proportional = 0;
    for (const auto& s : servers) resident += s->resident_mib(), proportional += s->proportional_mib();
    const double rps = static_cast<double>(load.latencies.size()) / load.seconds;
    if (layout.processes == 1 && layout.instances == 1) one_instance_rps = rps;
    Result row{"serve", served.label,
               std::to_string(layout.processes) + " process x " + std::to_string(layout.instances) + " inst" +
                   (layout.packed_cache ? " packed-cache" : "")};
    row.timing = summarize(load.latencies);
    row.extra["throughput_rps"] = rps;
    row.extra["p95_ms"] = percentile(load.latencies, 0.95) * 1e3;
    row.extra["resident_mib"] = resident;
    row.extra["pss_mib"] = proportional;
    row.extra["x_one"] = one_instance_rps > 0 ? rps / one_instance_rps : 0;
    row.extra["failed"] = load.failed;
    context.add(row);
  }

  // Where two instances' throughput comes from: one process with --instances 2 and --trace; the
  // server prints the Cube / Vector overlap and the instances' overlap of the traced span.
  {
    const std::string trace = (dir / "serve_trace.json").string();
    std::vector<std::string> flags = served.flags;
    flags.insert(flags.end(), {"--trace", trace});
    ServerProcess server(served.model, 2, flags, (dir / "trace.err").string());
    closed_loop({server.port()}, served.body, 4, 1);
    const LoadResult load = closed_loop({server.port()}, served.body, 4, served.per_client);
    server.stop();
    const std::string err = server.err();
    Result row{"serve", served.label, "1 process x 2 inst traced"};
    row.timing = summarize(load.latencies);
    const std::regex summary(
        "Cube busy ([0-9.]+)%, Vector busy ([0-9.]+)%, Cube and Vector at once ([0-9.]+)%, kernels of two or more "
        "instances at once ([0-9.]+)%");
    std::smatch match;
    if (!std::regex_search(err, match, summary)) throw std::runtime_error("serve --trace printed no overlap:\n" + err);
    row.extra["cube_busy_pct"] = std::stod(match[1]);
    row.extra["vector_busy_pct"] = std::stod(match[2]);
    row.extra["cv_overlap_pct"] = std::stod(match[3]);
    row.extra["instances_overlap_pct"] = std::stod(match[4]);
    context.add(row);
    if (const char* keep = std::getenv("CUBEVEC_SERVE_TRACE"); keep && *keep)
      std::filesystem::copy_file(trace, keep, std::filesystem::copy_options::overwrite_existing);
  }

  // A process's start: packing its own panels, writing a fresh cache, and mapping it.
  std::filesystem::remove_all(cache);
  Result row{"serve", served.label, "process start"};
  std::vector<double> starts;
  for (const char* how : {"packing", "writing the cache", "mapping the cache"}) {
    std::vector<std::string> flags = served.flags;
    if (std::string(how) != "packing") flags.insert(flags.end(), {"--packed-cache", cache});
    ServerProcess server(served.model, 1, flags, (dir / ("start" + std::to_string(process_number++) + ".err")).string());
    // Without the cache the panels are packed on a weight's first use: the first request pays it.
    const auto t0 = std::chrono::steady_clock::now();
    closed_loop({server.port()}, served.body, 1, 1);
    const double first_request = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    row.extra[std::string("start_s ") + how] = server.start_seconds();
    row.extra[std::string("first_request_s ") + how] = first_request;
    starts.push_back(server.start_seconds() + first_request);
  }
  row.timing = summarize(starts);
  context.add(row);
}

}  // namespace

void serve_suite(Context& context) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("cubevec_bench_serve_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string tinyflux = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";
  run_layouts(context, {tinyflux, "tinyflux 64x64 8 steps", kServeBody, {}, context.repeats * 2}, dir);

  // The leak check: resident memory after 100 requests and after 1,000 (with --repeats 5).
  {
    ServerProcess server(tinyflux, 2, {}, (dir / "leak.err").string());
    const int total = context.repeats * 200;
    const LoadResult first = closed_loop({server.port()}, kServeBody, 4, 25);
    const double after_first = server.resident_mib();
    const LoadResult rest = closed_loop({server.port()}, kServeBody, 4, (total - 100) / 4);
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

void serve_flux_suite(Context& context) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("cubevec_bench_serve_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string model = flux_width_served_folder();
  const std::string body =
      R"({"prompt": "a large red circle in the center on a blue background", "num_inference_steps": 2, "seed": 1, "size": "512x512"})";
  run_layouts(context, {model, "flux-width 512x512 2 steps bf16", body, {"--dtype", "bf16", "--max-size", "512"}, 1}, dir);
  std::filesystem::remove_all(dir);
}

}  // namespace cubevec::bench
