#include "server/job.h"

#include <utility>

namespace cubevec::server {

const char* status_name(JobStatus status) {
  switch (status) {
    case JobStatus::queued: return "queued";
    case JobStatus::in_progress: return "in_progress";
    case JobStatus::completed: return "completed";
    case JobStatus::failed: return "failed";
    case JobStatus::cancelled: return "cancelled";
  }
  return "unknown";
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Job::Job(std::string id, std::string model, std::string api, pipelines::Request request, bool video, int index_in_batch)
    : id_(std::move(id)),
      model_(std::move(model)),
      api_(std::move(api)),
      request_(std::move(request)),
      video_(video),
      index_(index_in_batch),
      created_at_(unix_seconds()) {
  push_event_locked("queued", {{"id", id_}, {"model", model_}});
}

void Job::push_event_locked(std::string name, nlohmann::ordered_json data) {
  events_.push_back({std::move(name), std::move(data)});
  changed_.notify_all();
}

void Job::mark_started() {
  std::lock_guard lock(mutex_);
  status_ = JobStatus::in_progress;
  stage_ = "text encoding and denoising";
  started_at_ = unix_seconds();
  started_ = std::chrono::steady_clock::now();
  push_event_locked("started", {{"id", id_}, {"stage", stage_}});
}

void Job::mark_step(int step, int steps, double step_seconds) {
  std::lock_guard lock(mutex_);
  step_ = step, steps_ = steps;
  step_seconds_sum_ += step_seconds;
  stage_ = "denoising";
  const double eta = step_seconds_sum_ / step * (steps - step);
  push_event_locked("progress", {{"step", step}, {"steps", steps}, {"stage", stage_}, {"eta", eta}});
}

void Job::mark_decoding() {
  std::lock_guard lock(mutex_);
  stage_ = "decoding";
  push_event_locked("decoding", {{"step", step_}, {"steps", steps_}, {"stage", stage_}});
}

void Job::finish_locked(JobStatus status) {
  status_ = status;
  stage_ = "done";
  completed_at_ = unix_seconds();
  finished_ = std::chrono::steady_clock::now();
  if (started_at_ == 0) started_ = finished_;
}

void Job::complete(std::vector<media::RgbImage> images, nlohmann::ordered_json report, int fps) {
  std::lock_guard lock(mutex_);
  images_ = std::make_shared<const std::vector<media::RgbImage>>(std::move(images));
  report_ = std::move(report);
  fps_ = fps;
  finish_locked(JobStatus::completed);
  push_event_locked("completed",
                    {{"id", id_}, {"outputs", images_->size()}, {"seconds", std::chrono::duration<double>(finished_ - started_).count()}});
}

void Job::fail(const ApiError& error) {
  std::lock_guard lock(mutex_);
  error_ = error;
  finish_locked(JobStatus::failed);
  push_event_locked("failed", error.to_json());
}

void Job::mark_cancelled(const std::string& why) {
  std::lock_guard lock(mutex_);
  error_ = ApiError(499, "cancelled", "cancelled", "", why);
  finish_locked(JobStatus::cancelled);
  push_event_locked("cancelled", {{"id", id_}, {"message", why}});
}

JobSnapshot Job::snapshot() const {
  std::lock_guard lock(mutex_);
  JobSnapshot s;
  s.status = status_;
  s.stage = stage_;
  s.step = step_, s.steps = steps_;
  if (status_ == JobStatus::completed) s.progress = 1.0;
  else if (steps_ > 0) s.progress = 0.95 * step_ / steps_;  // the decode is the last 5 %
  if (step_ > 0 && status_ == JobStatus::in_progress) s.eta_s = step_seconds_sum_ / step_ * (steps_ - step_);
  s.created_at = created_at_, s.started_at = started_at_, s.completed_at = completed_at_;
  if (started_at_ != 0) {
    const auto end = finished(status_) ? finished_ : std::chrono::steady_clock::now();
    s.seconds = std::chrono::duration<double>(end - started_).count();
  }
  s.error = error_;
  s.outputs = images_->size();
  return s;
}

bool Job::wait_finished(std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock lock(mutex_);
  return changed_.wait_until(lock, deadline, [&] { return finished(status_) && accounted_; });
}

void Job::mark_accounted() {
  std::lock_guard lock(mutex_);
  accounted_ = true;
  changed_.notify_all();
}

std::vector<JobEvent> Job::events_from(std::size_t from, std::chrono::steady_clock::time_point deadline, bool& is_finished) const {
  std::unique_lock lock(mutex_);
  changed_.wait_until(lock, deadline, [&] { return events_.size() > from || (finished(status_) && accounted_); });
  std::vector<JobEvent> out;
  for (std::size_t i = from; i < events_.size(); ++i) out.push_back(events_[i]);
  is_finished = finished(status_) && accounted_ && from + out.size() == events_.size();
  return out;
}

std::shared_ptr<const std::vector<media::RgbImage>> Job::images() const {
  std::lock_guard lock(mutex_);
  return images_;
}

nlohmann::ordered_json Job::report() const {
  std::lock_guard lock(mutex_);
  return report_;
}

int Job::fps() const {
  std::lock_guard lock(mutex_);
  return fps_;
}

std::chrono::steady_clock::time_point Job::finished_time() const {
  std::lock_guard lock(mutex_);
  return finished_;
}

}  // namespace cubevec::server
