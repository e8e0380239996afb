// The models a server keeps loaded, and the workers that run their jobs.
//
// Each model is loaded once (pipelines::Pipeline: immutable after load, one frozen copy of the
// weights and packed panels). `instances` workers per model each own a Device (their own Cube and
// Vector streams) and run one job at a time on the shared pipeline, so up to `instances` requests
// of a model run at once (MindIE SD's multi-instance with shared weights). Jobs beyond that wait in
// the model's queue, bounded by `max_queue`: a submit that would pass it is refused (429). A job
// running past `timeout_s` is stopped at its next step and fails (504). Finished jobs are kept for
// their results, the oldest dropped past `keep_finished`.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pipelines/pipeline.h"
#include "server/job.h"

namespace cubevec::server {

class RankRelay;

struct SchedulerOptions {
  int instances = 1;       // concurrent requests per model
  int max_queue = 16;      // waiting requests per model
  double timeout_s = 0;    // a job's whole life, queued and running (0: no limit)
  int keep_finished = 64;  // finished jobs kept for their results
  int video_fps = 16;      // the frame rate a video model's AVI is written at
  // Multi-rank serving (server/rank_relay.h): rank 0's one worker sends each request to the other
  // ranks. Needs one model and one instance.
  const RankRelay* relay = nullptr;
  // Record every kernel of every instance (`serve --trace`): the records grow with every request,
  // so this is for measurement runs. Read them after shutdown() with trace_sections().
  bool trace = false;
};

struct ServedModel {
  std::string name, dir;
  std::unique_ptr<pipelines::Pipeline> pipeline;
};

// Request latencies (queued + running, completed jobs) in Prometheus' histogram form.
inline constexpr std::array<double, 11> kLatencyBuckets{0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600};

struct ModelStats {
  std::string name;
  int queued = 0, running = 0, instances = 0;
  uint64_t completed = 0, failed = 0, cancelled = 0, rejected = 0;
  std::array<uint64_t, kLatencyBuckets.size()> latency_buckets{};  // cumulative, as Prometheus wants
  double latency_sum = 0;
  uint64_t denoising_steps = 0;
  double denoising_seconds = 0;
};

class Scheduler {
 public:
  Scheduler(std::vector<ServedModel> models, SchedulerOptions options);
  ~Scheduler();  // cancels what is left and joins the workers
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const SchedulerOptions& options() const { return options_; }
  std::vector<const ServedModel*> models() const;
  // By name; "" picks the only model when there is one. Unknown: 404 naming the loaded ones.
  const ServedModel& model(const std::string& name, const std::string& param = "model") const;

  // Queues one job per request (a batch: all or none). The requests must have passed
  // pipeline.checked(). Throws ApiError 429 when the queue cannot take them all, 503 when draining.
  std::vector<std::shared_ptr<Job>> submit(const std::string& model, const std::vector<pipelines::Request>& requests,
                                           const std::string& api);
  std::shared_ptr<Job> find(const std::string& id) const;  // null when unknown or dropped
  void forget(const std::string& id);                      // drops a finished job and its result
  // Jobs not finished, of every model (for AUTOMATIC1111's progress and interrupt).
  std::vector<std::shared_ptr<Job>> unfinished(const std::string& api = "") const;

  // Shutdown: refuse new jobs; wait until nothing runs or is queued (true) or `deadline` (false).
  void stop_accepting();
  bool accepting() const;
  bool wait_idle(std::chrono::steady_clock::time_point deadline) const;
  void cancel_all();
  // Cancels a job: a queued one leaves the queue at once (its place is free), a running one stops
  // at its next step. Nothing for a finished one.
  void cancel(Job& job);

  std::vector<ModelStats> stats() const;
  // Stops the workers (what is queued or running is cancelled) and joins them; the destructor
  // does the same. Idempotent.
  void shutdown();
  // With options().trace, after shutdown(): each instance's kernels as a section named
  // "<model> instance <i>", on one clock (seconds since the scheduler started).
  std::vector<TraceSection> trace_sections() const;
  // Multi-rank serving only: why the ranks can no longer run requests ("" while they can).
  std::string broken() const;

 private:
  struct ModelSlot {
    ServedModel served;
    std::deque<std::shared_ptr<Job>> queue;
    std::condition_variable work;
    ModelStats stats;
    std::vector<std::thread> threads;
    std::vector<TraceSection> traces;  // each finished instance's, with options().trace
  };
  void work(ModelSlot& slot, int instance);
  void run_job(ModelSlot& slot, Job& job, Device& device);
  void record_finished(ModelSlot& slot, Job& job);  // counts it, then marks it accounted
  std::string new_id(const std::string& prefix);

  SchedulerOptions options_;
  std::vector<std::unique_ptr<ModelSlot>> slots_;
  mutable std::mutex mutex_;
  mutable std::condition_variable idle_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  std::deque<std::string> finished_order_;
  bool accepting_ = true, stopping_ = false;
  std::string broken_;  // a rank failed: every later job fails with this
  uint64_t id_state_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

}  // namespace cubevec::server
