// One generation the server runs: its request, its state (queued, in progress, done), its progress
// as a list of events (what the SSE stream sends), and its result. Every route that generates makes
// jobs; the synchronous ones (OpenAI images, AUTOMATIC1111) wait for theirs, the job APIs return at
// once. Thread-safe: the worker that runs a job writes it, any number of HTTP threads read it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "media/jpeg.h"
#include "pipelines/request.h"
#include "server/api_error.h"

namespace cubevec::server {

enum class JobStatus { queued, in_progress, completed, failed, cancelled };
const char* status_name(JobStatus status);
inline bool finished(JobStatus status) { return status != JobStatus::queued && status != JobStatus::in_progress; }

// A progress event: "queued", "started", "progress" (a denoising step), "decoding", then exactly
// one of "completed", "failed", "cancelled".
struct JobEvent {
  std::string name;
  nlohmann::ordered_json data;
};

struct JobSnapshot {
  JobStatus status = JobStatus::queued;
  std::string stage;  // "queued", "text encoding and denoising", "decoding", "done"
  int step = 0, steps = 0;
  double progress = 0;                                       // 0..1
  std::optional<double> eta_s;                               // seconds left, once a step has run
  int64_t created_at = 0, started_at = 0, completed_at = 0;  // unix seconds (0: not yet)
  double seconds = 0;                                        // in progress or done: since it started
  std::optional<ApiError> error;
  std::size_t outputs = 0;  // images, or a video's frames
};

class Job {
 public:
  Job(std::string id, std::string model, std::string api, pipelines::Request request, bool video, int index_in_batch = 0);

  const std::string& id() const { return id_; }
  const std::string& model() const { return model_; }
  const std::string& api() const { return api_; }  // "openai", "a1111", "video", "native"
  const pipelines::Request& request() const { return request_; }
  bool video() const { return video_; }
  int index_in_batch() const { return index_; }
  std::chrono::steady_clock::time_point queued_at() const { return queued_at_; }

  // Set by a caller to stop the job at its next step (or before it starts).
  void request_cancel() { cancel_ = true; }
  const std::atomic<bool>& cancel_flag() const { return cancel_; }
  bool cancel_requested() const { return cancel_.load(); }

  // The worker's side.
  void mark_started();
  void mark_step(int step, int steps, double step_seconds);
  void mark_decoding();
  void complete(std::vector<media::RgbImage> images, nlohmann::ordered_json report, int fps);
  void fail(const ApiError& error);
  void mark_cancelled(const std::string& why);
  // The scheduler has counted the finished job in its metrics. wait_finished and a finished event
  // stream return only after this, so a client that got its answer finds it in /metrics.
  void mark_accounted();

  // The readers' side.
  JobSnapshot snapshot() const;
  // Waits until the job is finished and accounted or `deadline`; true when both.
  bool wait_finished(std::chrono::steady_clock::time_point deadline) const;
  // Events from index `from` on, waiting up to `deadline` for at least one; `finished` is set when
  // the last event has been sent.
  std::vector<JobEvent> events_from(std::size_t from, std::chrono::steady_clock::time_point deadline, bool& finished) const;
  // The result (empty unless completed), shared: a route reading one frame copies nothing.
  std::shared_ptr<const std::vector<media::RgbImage>> images() const;
  nlohmann::ordered_json report() const;
  int fps() const;
  std::chrono::steady_clock::time_point finished_time() const;

 private:
  void push_event_locked(std::string name, nlohmann::ordered_json data);
  void finish_locked(JobStatus status);

  const std::string id_, model_, api_;
  const pipelines::Request request_;
  const bool video_;
  const int index_;
  const std::chrono::steady_clock::time_point queued_at_ = std::chrono::steady_clock::now();
  std::atomic<bool> cancel_{false};

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  JobStatus status_ = JobStatus::queued;
  bool accounted_ = false;
  std::string stage_ = "queued";
  int step_ = 0, steps_ = 0;
  double step_seconds_sum_ = 0;
  int64_t created_at_, started_at_ = 0, completed_at_ = 0;
  std::chrono::steady_clock::time_point started_, finished_;
  std::optional<ApiError> error_;
  std::shared_ptr<const std::vector<media::RgbImage>> images_ = std::make_shared<const std::vector<media::RgbImage>>();
  nlohmann::ordered_json report_;
  int fps_ = 0;
  std::vector<JobEvent> events_;
};

int64_t unix_seconds();

}  // namespace cubevec::server
