// The `cubevec serve` process: it binds loopback by default and prints its address; SIGTERM stops
// new requests, lets the running one finish and exits 0; --drain-timeout cancels what is left;
// a second signal ends it at once; its pictures equal `cubevec t2i --out x.png`'s for the same
// request (also when it maps the packed cache a `t2i --packed-cache` wrote); a port in use is an
// error naming the address; --trace writes every instance's kernels and their overlap.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/run_cubevec.h"
#include "server/test_server.h"

namespace serve_process_test {

using namespace cubevec_cli_test;
using cubevec_server_test::from_base64;
using cubevec_server_test::kPrompt;
using cubevec_server_test::png_of;
using nlohmann::json;

// A `cubevec serve` child process, its stderr in a file.
class ServeProcess {
 public:
  // `launcher`: what runs the binary (mpirun and its flags), or nothing.
  ServeProcess(std::vector<std::string> args, const fs::path& dir, std::vector<std::string> launcher = {})
      : err_path_((dir / ("serve" + std::to_string(next_number()++) + ".err")).string()) {
    args.insert(args.begin(), {CUBEVEC_BINARY, "serve", "--port", "0"});
    args.insert(args.begin(), launcher.begin(), launcher.end());
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      const int err = ::open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err < 0 || ::dup2(err, 2) < 0) ::_exit(127);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    // The address it prints once it listens.
    const std::regex listening("listening on http://([0-9.]+):([0-9]+) \\(pid ([0-9]+)");
    for (int i = 0; i < 600 && port_ == 0; ++i) {
      std::smatch match;
      const std::string text = err();
      if (std::regex_search(text, match, listening)) host_ = match[1], port_ = std::stoi(match[2]), server_pid_ = std::stoi(match[3]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~ServeProcess() {
    if (pid_ > 0 && status_ < 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  static int& next_number() {
    static int number = 0;
    return number;
  }
  std::string err() const { return read_file(err_path_); }
  const std::string& host() const { return host_; }
  int port() const { return port_; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c;
  }
  void signal(int sig) const { ::kill(pid_, sig); }
  // The serving process itself (under mpirun: rank 0, not mpirun), as it prints its pid.
  void signal_server(int sig) const { ::kill(server_pid_, sig); }
  // The exit status (128 + signal when killed by one), or -1 after `seconds`.
  int wait_exit(double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      int wstatus = 0;
      if (::waitpid(pid_, &wstatus, WNOHANG) == pid_) {
        status_ = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        return status_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  std::string err_path_, host_;
  pid_t pid_ = -1;
  int port_ = 0, status_ = -1, server_pid_ = -1;
};

std::string submit(const ServeProcess& server, int steps) {
  const auto r = server.client().Post("/v1/jobs", json{{"prompt", kPrompt}, {"num_inference_steps", steps}}.dump(), "application/json");
  if (!r || r->status != 202) return "";
  return json::parse(r->body)["id"];
}

std::string status_of(const ServeProcess& server, const std::string& id) {
  const auto r = server.client().Get(("/v1/jobs/" + id).c_str());
  return r && r->status == 200 ? json::parse(r->body)["status"].get<std::string>() : "(no answer)";
}

void wait_status_not(const ServeProcess& server, const std::string& id, const std::string& status) {
  for (int i = 0; i < 1000 && status_of(server, id) == status; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

class ServeProcessTest : public CliTest {};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST_F(ServeProcessTest, BindsLoopbackAndSigtermDrainsTheRunningJob) {
  ServeProcess server({"--model", kTinyFlux, "--max-steps", "1000"}, dir_);
  ASSERT_GT(server.port(), 0) << server.err();
  EXPECT_EQ(server.host(), "127.0.0.1");
  const std::string id = submit(server, 150);
  ASSERT_FALSE(id.empty());
  wait_status_not(server, id, "queued");
  server.signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Draining: no new requests, the running one goes on.
  const auto refused = server.client().Post("/v1/jobs", json{{"prompt", kPrompt}}.dump(), "application/json");
  if (refused) {  // the listener may already be closed once the job is done
    EXPECT_EQ(refused->status, 503) << refused->body;
    EXPECT_EQ(server.client().Get("/health")->status, 503);
  }
  wait_status_not(server, id, "in_progress");
  EXPECT_EQ(server.wait_exit(60), 0) << server.err();
  EXPECT_NE(server.err().find("stop signal"), std::string::npos) << server.err();
  EXPECT_NE(server.err().find("serve: stopped"), std::string::npos) << server.err();
}

// --trace: every instance's kernels in one Chrome trace, and the overlap they show on stderr.
TEST_F(ServeProcessTest, TraceRecordsEveryInstanceAndPrintsTheirOverlap) {
  const std::string trace = (dir_ / "serve.json").string();
  ServeProcess server({"--model", kTinyFlux, "--instances", "2", "--trace", trace}, dir_);
  ASSERT_GT(server.port(), 0) << server.err();
  const std::string a = submit(server, 4), b = submit(server, 4);
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  for (const std::string& id : {a, b}) {
    wait_status_not(server, id, "queued");
    wait_status_not(server, id, "in_progress");
    EXPECT_EQ(status_of(server, id), "completed");
  }
  server.signal(SIGTERM);
  ASSERT_EQ(server.wait_exit(60), 0) << server.err();
  const json events = json::parse(read_file(trace))["traceEvents"];
  std::set<std::string> processes;
  int kernels = 0;
  for (const json& e : events) {
    if (e["ph"] == "M" && e["name"] == "process_name") processes.insert(e["args"]["name"].get<std::string>());
    if (e["ph"] == "X") ++kernels;
  }
  EXPECT_TRUE(processes.count("tinyflux instance 0: measured on this CPU, by unit")) << events.dump().substr(0, 2000);
  EXPECT_TRUE(processes.count("tinyflux instance 1: measured on this CPU, by unit"));
  EXPECT_GT(kernels, 100);
  const std::regex summary(
      "trace written to .*serve\\.json \\(2 instance\\(s\\), [0-9.]+ s from the first kernel to the last\\): "
      "Cube busy [0-9.]+%, Vector busy [0-9.]+%, Cube and Vector at once [0-9.]+%, kernels of two or more "
      "instances at once [0-9.]+%");
  EXPECT_TRUE(std::regex_search(server.err(), summary)) << server.err();
}

TEST_F(ServeProcessTest, DrainTimeoutCancelsWhatIsLeftAndASecondSignalEndsAtOnce) {
  {
    ServeProcess server({"--model", kTinyFlux, "--max-steps", "1000", "--drain-timeout", "0.2"}, dir_);
    ASSERT_GT(server.port(), 0) << server.err();
    const std::string id = submit(server, 1000);
    wait_status_not(server, id, "queued");
    server.signal(SIGINT);
    EXPECT_EQ(server.wait_exit(30), 0) << server.err();
    EXPECT_NE(server.err().find("cancelling"), std::string::npos) << server.err();
  }
  ServeProcess server({"--model", kTinyFlux, "--max-steps", "1000", "--drain-timeout", "60"}, dir_);
  ASSERT_GT(server.port(), 0) << server.err();
  const std::string id = submit(server, 1000);
  wait_status_not(server, id, "queued");
  server.signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  server.signal(SIGTERM);
  EXPECT_EQ(server.wait_exit(10), 128 + SIGTERM) << server.err();
  EXPECT_NE(server.err().find("again while draining"), std::string::npos) << server.err();
}

TEST_F(ServeProcessTest, PicturesEqualTheCommandLinesPng) {
  const std::string png = (dir_ / "cli.png").string();
  const Process cli = run(
      {"t2i", "--model", kTinyFlux, "--prompt", kPrompt, "--steps", "3", "--seed", "9", "--width", "48", "--height", "32", "--out", png});
  ASSERT_EQ(cli.status, 0) << cli.err;
  const std::string file = read_file(png);
  ASSERT_EQ(file.substr(1, 3), "PNG");  // --out x.png writes PNG
  ServeProcess server({"--model", kTinyFlux}, dir_);
  ASSERT_GT(server.port(), 0) << server.err();
  const auto r = server.client().Post("/v1/images/generations",
                                      json{{"prompt", kPrompt}, {"num_inference_steps", 3}, {"seed", 9}, {"size", "48x32"}}.dump(),
                                      "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(png_of(from_base64(json::parse(r->body)["data"][0]["b64_json"])).pixels, png_of(file).pixels);
  server.signal(SIGTERM);
  EXPECT_EQ(server.wait_exit(30), 0);
}

TEST_F(ServeProcessTest, AServerMapsThePackedCacheACommandWroteAndDrawsTheSamePicture) {
  const std::string png = (dir_ / "cli.png").string(), cache = (dir_ / "packed").string();
  const Process cli = run({"t2i", "--model", kTinyFlux, "--prompt", kPrompt, "--steps", "2", "--seed", "4", "--width", "32", "--height",
                           "32", "--out", png, "--packed-cache", cache});
  ASSERT_EQ(cli.status, 0) << cli.err;
  EXPECT_NE(cli.err.find("packed cache: written " + cache + "/tinyflux-"), std::string::npos) << cli.err;
  ServeProcess server({"--model", kTinyFlux, "--packed-cache", cache}, dir_);
  ASSERT_GT(server.port(), 0) << server.err();
  EXPECT_NE(server.err().find("serve: packed cache: mapped " + cache + "/tinyflux-"), std::string::npos) << server.err();
  EXPECT_NE(server.err().find(" 0 packed here"), std::string::npos) << server.err();
  const auto r = server.client().Post(
      "/v1/jobs", json{{"prompt", kPrompt}, {"num_inference_steps", 2}, {"seed", 4}, {"width", 32}, {"height", 32}}.dump(),
      "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 202) << r->body;
  const std::string id = json::parse(r->body)["id"];
  wait_status_not(server, id, "queued");
  wait_status_not(server, id, "in_progress");
  const auto content = server.client().Get(("/v1/jobs/" + id + "/content").c_str());
  ASSERT_TRUE(content);
  ASSERT_EQ(content->status, 200) << content->body;
  EXPECT_EQ(png_of(content->body).pixels, png_of(read_file(png)).pixels);
  // The job's report names the cache file, not the server's folder.
  const json job = json::parse(server.client().Get(("/v1/jobs/" + id).c_str())->body);
  const json& report = job["result"]["report"];
  ASSERT_TRUE(report.contains("packed_cache")) << job.dump();
  EXPECT_EQ(report["packed_cache"]["state"], "mapped");
  EXPECT_EQ(report["packed_cache"]["file"].get<std::string>().find('/'), std::string::npos) << job.dump();
  server.signal(SIGTERM);
  EXPECT_EQ(server.wait_exit(30), 0);
}

TEST_F(ServeProcessTest, BadFlagsAndAPortInUseAreErrors) {
  ServeProcess first({"--model", kTinyFlux}, dir_);
  ASSERT_GT(first.port(), 0) << first.err();
  const Process taken = run({"serve", "--model", kTinyFlux, "--port", std::to_string(first.port())});
  EXPECT_EQ(taken.status, 1);
  EXPECT_NE(taken.err.find("cannot listen on 127.0.0.1:" + std::to_string(first.port())), std::string::npos) << taken.err;
  const Process no_model = run({"serve"});
  EXPECT_EQ(no_model.status, 1);
  EXPECT_NE(no_model.err.find("--model DIR is required"), std::string::npos) << no_model.err;
  const Process twice = run({"serve", "--model", kTinyFlux, "--model", kTinyFlux});
  EXPECT_NE(twice.err.find("given twice"), std::string::npos) << twice.err;
  const Process bad_name = run({"serve", "--model", "a b=" + kTinyFlux});
  EXPECT_NE(bad_name.err.find("letters, digits"), std::string::npos) << bad_name.err;
  const Process missing = run({"serve", "--model", (dir_ / "nothing").string()});
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("nothing"), std::string::npos) << missing.err;
  first.signal(SIGTERM);
  EXPECT_EQ(first.wait_exit(30), 0);
}

// Serving past one machine: rank 0 answers, both ranks run each request (Ulysses over the heads),
// and the pictures are the one-process server's; SIGTERM to mpirun stops every rank with status 0.
TEST_F(ServeProcessTest, UnderMpirunEveryRequestRunsOnAllRanksWithTheOneProcessPixels) {
  const std::string body = json{{"prompt", kPrompt}, {"num_inference_steps", 3}, {"seed", 6}, {"size", "48x32"}}.dump();
  const auto pixels_of = [&](const ServeProcess& server) {
    const auto r = server.client().Post("/v1/images/generations", body, "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : std::string("no answer")) << server.err();
    return r && r->status == 200 ? png_of(from_base64(json::parse(r->body)["data"][0]["b64_json"])).pixels : std::vector<uint8_t>{};
  };
  std::vector<uint8_t> one;
  {
    ServeProcess server({"--model", kTinyFlux}, dir_);
    ASSERT_GT(server.port(), 0) << server.err();
    one = pixels_of(server);
    server.signal(SIGTERM);
    EXPECT_EQ(server.wait_exit(30), 0);
  }
  ServeProcess server({"--model", kTinyFlux, "--ulysses", "2"}, dir_, with(mpirun_command(dir_), {"-np", "2"}));
  ASSERT_GT(server.port(), 0) << server.err();
  EXPECT_NE(server.err().find("every request on 2 ranks"), std::string::npos) << server.err();
  const std::vector<uint8_t> two = pixels_of(server);
  ASSERT_FALSE(one.empty());
  EXPECT_EQ(two, one);
  // A prompt word the tokenizer refuses fails that request only (rank 0 encodes before the others
  // commit); the ranks then go on serving.
  const auto word = server.client().Post("/v1/images/generations", json{{"prompt", "a red zebra"}}.dump(), "application/json");
  ASSERT_TRUE(word);
  EXPECT_EQ(word->status, 400) << word->body;
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // past an idle beat or two
  EXPECT_EQ(pixels_of(server), one);
  EXPECT_EQ(json::parse(server.client().Get("/health")->body)["status"], "ok");
  // SIGTERM to rank 0: it drains, tells the others to stop, and every rank exits 0.
  server.signal_server(SIGTERM);
  EXPECT_EQ(server.wait_exit(60), 0) << server.err();
}

// A rank that fails fails the request at once through the failure channel (rank 1 is started
// with a --memory-limit no request fits, mpirun's MPMD form), and the server answers every later
// request 503 and /health "failed" instead of hanging; SIGTERM to rank 0 still ends it.
TEST_F(ServeProcessTest, UnderMpirunAFailedRankFailsTheRequestNeverHangs) {
  const std::string binary = CUBEVEC_BINARY;
  // mpirun -np 1 cubevec serve ... : -np 1 cubevec serve ... --memory-limit 2M
  ServeProcess server(
      {"--model", kTinyFlux, "--ulysses", "2", "--memory-limit", "2M"}, dir_,
      with(mpirun_command(dir_), {"-np", "1", binary, "serve", "--port", "0", "--model", kTinyFlux, "--ulysses", "2", ":", "-np", "1"}));
  ASSERT_GT(server.port(), 0) << server.err();
  const std::string body = json{{"prompt", kPrompt}, {"num_inference_steps", 2}}.dump();
  const auto start = std::chrono::steady_clock::now();
  const auto failed = server.client().Post("/v1/images/generations", body, "application/json");
  ASSERT_TRUE(failed);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  EXPECT_EQ(failed->status, 500) << failed->body;
  EXPECT_NE(failed->body.find("rank 1 failed"), std::string::npos) << failed->body;
  const auto later = server.client().Post("/v1/images/generations", body, "application/json");
  EXPECT_EQ(later->status, 503) << later->body;
  const auto health = server.client().Get("/health");
  EXPECT_EQ(health->status, 503);
  EXPECT_EQ(json::parse(health->body)["status"], "failed");
  server.signal_server(SIGTERM);
  EXPECT_GE(server.wait_exit(60), 0) << server.err();  // mpirun reports rank 1's status 1
}

// Errors of the multi-rank flags: more than one model or instance, degrees without mpirun.
TEST_F(ServeProcessTest, MultiRankFlagsAreCheckedBeforeServing) {
  const Process alone = run({"serve", "--model", kTinyFlux, "--ulysses", "2"});
  EXPECT_EQ(alone.status, 1);
  EXPECT_NE(alone.err.find("but this run has one: start it with mpirun -np 2"), std::string::npos) << alone.err;
  const Process instances = run_program(
      with(mpirun_command(dir_), {"-np", "2", CUBEVEC_BINARY, "serve", "--model", kTinyFlux, "--ulysses", "2", "--instances", "2"}), dir_);
  EXPECT_NE(instances.status, 0);
  EXPECT_NE(instances.err.find("one --model with --instances 1"), std::string::npos) << instances.err;
}

}  // namespace serve_process_test
