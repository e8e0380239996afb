#include "server/scheduler.h"

#include <algorithm>
#include <filesystem>
#include <cstdio>
#include <new>
#include <optional>
#include <random>
#include <utility>

#include "base/config_reader.h"
#include "base/error.h"
#include "device/device.h"
#include "device/device_profile.h"
#include "parallel/mpi_runtime.h"
#include "server/rank_relay.h"

namespace cubevec::server {

namespace {

// The report names the model by its server name: a client learns nothing of the server's paths.
void replace_in_strings(nlohmann::ordered_json& json, const std::string& from, const std::string& to) {
  if (json.is_string()) {
    std::string text = json.get<std::string>();
    for (std::size_t at = text.find(from); !from.empty() && at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
    json = text;
  } else if (json.is_structured()) {
    for (auto& item : json) replace_in_strings(item, from, to);
  }
}

ApiError timeout_error(double timeout_s) {
  return ApiError(504, "timeout_error", "timeout", "",
                  "the request took longer than the server's --timeout of " + number_for_message(timeout_s) + " s and was stopped");
}

}  // namespace

Scheduler::Scheduler(std::vector<ServedModel> models, SchedulerOptions options) : options_(options) {
  if (models.empty()) throw Error("serve: no model to serve (--model DIR)");
  if (options_.instances < 1) throw Error("--instances must be at least 1");
  if (options_.relay && (models.size() != 1 || options_.instances != 1))
    throw Error("serving under mpirun runs one model with one instance (every rank runs each request together); got " +
                std::to_string(models.size()) + " model(s) and --instances " + std::to_string(options_.instances));
  std::random_device entropy;
  id_state_ = (uint64_t{entropy()} << 32) ^ entropy();
  for (ServedModel& served : models) {
    auto slot = std::make_unique<ModelSlot>();
    slot->stats.name = served.name;
    slot->stats.instances = options_.instances;
    slot->served = std::move(served);
    slots_.push_back(std::move(slot));
  }
  for (auto& slot : slots_)
    for (int i = 0; i < options_.instances; ++i) slot->threads.emplace_back([this, s = slot.get(), i] { work(*s, i); });
}

Scheduler::~Scheduler() { shutdown(); }

void Scheduler::shutdown() {
  {
    std::lock_guard lock(mutex_);
    accepting_ = false;
    stopping_ = true;
    for (auto& slot : slots_) {
      for (const auto& job : slot->queue) job->request_cancel();
      slot->work.notify_all();
    }
    for (auto& [id, job] : jobs_) job->request_cancel();
  }
  for (auto& slot : slots_)
    for (std::thread& thread : slot->threads)
      if (thread.joinable()) thread.join();
}

std::vector<TraceSection> Scheduler::trace_sections() const {
  std::lock_guard lock(mutex_);
  std::vector<TraceSection> out;
  for (const auto& slot : slots_) out.insert(out.end(), slot->traces.begin(), slot->traces.end());
  return out;
}

std::vector<const ServedModel*> Scheduler::models() const {
  std::vector<const ServedModel*> out;
  for (const auto& slot : slots_) out.push_back(&slot->served);
  return out;
}

const ServedModel& Scheduler::model(const std::string& name, const std::string& param) const {
  if (name.empty() && slots_.size() == 1) return slots_.front()->served;
  std::string names;
  for (const auto& slot : slots_) {
    if (slot->served.name == name) return slot->served;
    names += (names.empty() ? "" : ", ") + slot->served.name;
  }
  if (name.empty()) throw invalid_request(param, "'" + param + "' is required: this server has several models (" + names + ")");
  throw ApiError(404, "invalid_request_error", "model_not_found", param,
                 "the model " + json_for_message(name) + " does not exist on this server; it serves " + names);  // quoted, escaped
}

std::string Scheduler::new_id(const std::string& prefix) {
  // splitmix64 over a random start: unique within the process, not guessable from the last one.
  id_state_ += 0x9e3779b97f4a7c15ULL;
  uint64_t z = id_state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(z));
  return prefix + hex;
}

std::vector<std::shared_ptr<Job>> Scheduler::submit(const std::string& model, const std::vector<pipelines::Request>& requests,
                                                    const std::string& api) {
  const ServedModel& served = this->model(model);
  std::lock_guard lock(mutex_);
  if (!accepting_) throw unavailable("the server is shutting down and takes no new requests");
  ModelSlot& slot = **std::find_if(slots_.begin(), slots_.end(), [&](const auto& s) { return &s->served == &served; });
  const int queued = static_cast<int>(slot.queue.size());
  // What no instance can start now waits in the queue.
  const int free_instances = std::max(0, options_.instances - slot.stats.running - queued);
  if (queued + static_cast<int>(requests.size()) - free_instances > options_.max_queue) {
    ++slot.stats.rejected;
    throw queue_full(served.name, queued, options_.max_queue);
  }
  const bool video = served.pipeline->model().video();
  const std::string prefix = api == "video" ? "video_" : api == "native" ? "job_" : "img_";
  std::vector<std::shared_ptr<Job>> jobs;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    auto job = std::make_shared<Job>(new_id(prefix), served.name, api, requests[i], video, static_cast<int>(i));
    jobs_[job->id()] = job;
    slot.queue.push_back(job);
    jobs.push_back(std::move(job));
  }
  slot.stats.queued = static_cast<int>(slot.queue.size());
  slot.work.notify_all();
  return jobs;
}

std::shared_ptr<Job> Scheduler::find(const std::string& id) const {
  std::lock_guard lock(mutex_);
  const auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

void Scheduler::forget(const std::string& id) {
  std::lock_guard lock(mutex_);
  const auto it = jobs_.find(id);
  if (it == jobs_.end() || !finished(it->second->snapshot().status)) return;
  jobs_.erase(it);
  finished_order_.erase(std::remove(finished_order_.begin(), finished_order_.end(), id), finished_order_.end());
}

std::vector<std::shared_ptr<Job>> Scheduler::unfinished(const std::string& api) const {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<Job>> out;
  for (const auto& [id, job] : jobs_)
    if (!finished(job->snapshot().status) && (api.empty() || job->api() == api)) out.push_back(job);
  return out;
}

void Scheduler::stop_accepting() {
  std::lock_guard lock(mutex_);
  accepting_ = false;
}

bool Scheduler::accepting() const {
  std::lock_guard lock(mutex_);
  return accepting_;
}

bool Scheduler::wait_idle(std::chrono::steady_clock::time_point deadline) const {
  std::unique_lock lock(mutex_);
  return idle_.wait_until(lock, deadline, [&] {
    return std::all_of(slots_.begin(), slots_.end(), [](const auto& s) { return s->queue.empty() && s->stats.running == 0; });
  });
}

void Scheduler::cancel_all() {
  std::vector<std::shared_ptr<Job>> all;
  {
    std::lock_guard lock(mutex_);
    for (auto& [id, job] : jobs_) all.push_back(job);
  }
  for (const auto& job : all) cancel(*job);
}

void Scheduler::cancel(Job& job) {
  job.request_cancel();
  {
    std::lock_guard lock(mutex_);
    for (auto& slot : slots_) {
      const auto it = std::find_if(slot->queue.begin(), slot->queue.end(), [&](const auto& queued) { return queued.get() == &job; });
      if (it == slot->queue.end()) continue;
      slot->queue.erase(it);
      slot->stats.queued = static_cast<int>(slot->queue.size());
      job.mark_cancelled("cancelled while queued");
      record_finished(*slot, job);
      break;
    }
  }
  idle_.notify_all();
}

std::string Scheduler::broken() const {
  std::lock_guard lock(mutex_);
  return broken_;
}

std::vector<ModelStats> Scheduler::stats() const {
  std::lock_guard lock(mutex_);
  std::vector<ModelStats> out;
  for (const auto& slot : slots_) out.push_back(slot->stats);
  return out;
}

void Scheduler::work(ModelSlot& slot, int instance) {
  const pipelines::Pipeline& pipeline = *slot.served.pipeline;
  // This instance's own Cube and Vector streams; a machine-sized profile's cores are shared among
  // the model's instances, which run at once under load.
  Device device(profile_for_instance(pipeline.profile(), options_.instances), DeviceOptions{.trace = options_.trace});
  // The instance's trace, on the scheduler's clock, kept when the worker ends.
  struct KeepTrace {
    Scheduler& scheduler;
    ModelSlot& slot;
    Device& device;
    int instance;
    ~KeepTrace() {
      if (!scheduler.options_.trace) return;
      try {
        device.synchronize();
      } catch (const std::exception&) {  // a failed stream: its job has failed already; keep what ran
      }
      TraceSection section{slot.served.name + " instance " + std::to_string(instance), device.trace().records()};
      const double shift = std::chrono::duration<double>(device.trace().epoch() - scheduler.started_).count();
      for (KernelRecord& r : section.records)
        if (r.ran) r.real_start_s += shift, r.real_end_s += shift;
      std::lock_guard lock(scheduler.mutex_);
      slot.traces.push_back(std::move(section));
    }
  } keep_trace{*this, slot, device, instance};
  const RankRelay* relay = options_.relay;
  const auto relay_send = [&](const nlohmann::json& command) {
    if (!relay || !broken().empty()) return;
    try {
      relay->send(command);
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex_);
      broken_ = e.what();
    }
  };
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mutex_);
      const auto ready = [&] { return stopping_ || !slot.queue.empty(); };
      if (relay) {
        // The other ranks wait in a collective for the next command: tell them we are here.
        if (!slot.work.wait_for(lock, std::chrono::duration<double>(relay->idle_interval_s()), ready)) {
          lock.unlock();
          relay_send({{"op", "idle"}});
          continue;
        }
      } else {
        slot.work.wait(lock, ready);
      }
      if (slot.queue.empty()) {  // stopping, nothing left
        lock.unlock();
        relay_send({{"op", "stop"}});
        return;
      }
      job = std::move(slot.queue.front());
      slot.queue.pop_front();
      slot.stats.queued = static_cast<int>(slot.queue.size());
      ++slot.stats.running;
    }
    run_job(slot, *job, device);
    if (relay) relay_send({{"op", "finished"}});
    {
      std::lock_guard lock(mutex_);
      --slot.stats.running;
      record_finished(slot, *job);
    }
    idle_.notify_all();
  }
}

void Scheduler::run_job(ModelSlot& slot, Job& job, Device& device) {
  const auto deadline = options_.timeout_s > 0 ? job.queued_at() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                       std::chrono::duration<double>(options_.timeout_s))
                                               : std::chrono::steady_clock::time_point::max();
  if (job.cancel_requested()) return job.mark_cancelled("cancelled before it started");
  if (std::chrono::steady_clock::now() > deadline) return job.fail(timeout_error(options_.timeout_s));
  if (const std::string reason = broken(); !reason.empty())
    return job.fail(unavailable("the server's ranks cannot run requests any more (" + reason + "); restart it"));
  job.mark_started();
  bool timed_out = false;
  std::atomic<bool> stop{false};
  pipelines::GenerateHooks hooks;
  hooks.device = &device;
  hooks.cancel = &stop;
  hooks.on_step = [&](const pipelines::Progress& p) {
    job.mark_step(p.step, p.steps, p.seconds);
    if (std::chrono::steady_clock::now() > deadline) timed_out = true;
    if (timed_out || job.cancel_requested()) stop = true;
    if (p.step == p.steps && !stop) job.mark_decoding();
  };
  std::optional<pipelines::TextConditioning> text;
  try {
    if (job.cancel_requested()) throw pipelines::Cancelled();
    if (const RankRelay* relay = options_.relay) {
      // The prompt is encoded before any other rank commits to the run, so a word the tokenizer
      // refuses fails this request only; then every rank runs it.
      text = slot.served.pipeline->encode_prompt(job.request(), device);
      hooks.text = &*text;
      try {
        relay->send({{"op", "generate"}, {"request", job.request().to_json()}});
      } catch (const std::exception& e) {
        {
          std::lock_guard lock(mutex_);
          broken_ = e.what();
        }
        throw unavailable(std::string("the other ranks cannot run requests: ") + e.what());
      }
    }
    pipelines::GenerationResult result = slot.served.pipeline->generate(job.request(), hooks);
    replace_in_strings(result.report, slot.served.pipeline->model_dir(), slot.served.name);
    // The server's folders stay private: the packed cache is named by its file alone.
    if (result.report.contains("packed_cache"))
      result.report["packed_cache"]["file"] =
          std::filesystem::path(result.report["packed_cache"]["file"].get<std::string>()).filename().string();
    job.complete(std::move(result.images), std::move(result.report), options_.video_fps);
  } catch (const pipelines::Cancelled&) {
    if (timed_out) job.fail(timeout_error(options_.timeout_s));
    else job.mark_cancelled("cancelled at step " + std::to_string(job.snapshot().step));
  } catch (const ApiError& e) {
    job.fail(e);
  } catch (const std::bad_alloc&) {
    job.fail(ApiError(507, "server_error", "out_of_memory", "",
                      "the server ran out of memory for this request (use a smaller size or fewer steps)"));
  } catch (const OutOfMemoryError& e) {
    job.fail(ApiError(507, "server_error", "out_of_memory", "", e.what()));
  } catch (const Error& e) {
    if (options_.relay) {
      // A rank that failed mid-run leaves the run's communicators unusable.
      if (const std::optional<std::string> failure = parallel::received_failure()) {
        {
          std::lock_guard lock(mutex_);
          broken_ = *failure;
        }
        return job.fail(ApiError(500, "server_error", "rank_failed", "", std::string("the request failed on another rank: ") + e.what()));
      }
    }
    // What the checks before queueing cannot see (a prompt word the tokenizer refuses, a sparse
    // setting the latent's shape rules out, more memory than the server allows) is the request's:
    // cubevec's errors name their input. A non-finite output is the model's.
    const ApiError error = from_library_error(e.what());
    std::string message = error.what();
    if (const std::size_t at = message.find("memory_limit"); at != std::string::npos)
      message.replace(at, 12, "the server's --memory-limit");
    // ... unless the request's own LoRAs made it so (their scale or values).
    if (message.find("non-finite") != std::string::npos && error.param() != "lora")
      job.fail(ApiError(500, "server_error", "generation_failed", "", message));
    else job.fail(ApiError(400, "invalid_request_error", "cannot_generate", error.param(), message));
  } catch (const std::exception& e) {
    job.fail(ApiError(500, "server_error", "internal_error", "", std::string("internal error: ") + e.what()));
  }
  // A cancel that came while the job finished still leaves it as it ended.
}

void Scheduler::record_finished(ModelSlot& slot, Job& job) {
  const JobSnapshot s = job.snapshot();
  ModelStats& stats = slot.stats;
  if (s.status == JobStatus::completed) {
    ++stats.completed;
    const double latency = std::chrono::duration<double>(job.finished_time() - job.queued_at()).count();
    stats.latency_sum += latency;
    for (std::size_t i = 0; i < kLatencyBuckets.size(); ++i)
      if (latency <= kLatencyBuckets[i]) ++stats.latency_buckets[i];
    stats.denoising_steps += static_cast<uint64_t>(s.steps);
  } else if (s.status == JobStatus::cancelled) {
    ++stats.cancelled;
  } else {
    ++stats.failed;
  }
  const nlohmann::ordered_json report = job.report();
  if (report.contains("stages_s") && report["stages_s"].contains("denoising"))
    stats.denoising_seconds += report["stages_s"]["denoising"].get<double>();
  job.mark_accounted();
  finished_order_.push_back(job.id());
  while (static_cast<int>(finished_order_.size()) > options_.keep_finished) {
    jobs_.erase(finished_order_.front());
    finished_order_.pop_front();
  }
}

}  // namespace cubevec::server
