// cubevec's own job API (POST /v1/jobs with the library's request JSON, progress as Server-Sent
// Events, DELETE to cancel), OpenAI-style video jobs (/v1/videos), /health and /metrics.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "media/avi.h"
#include "server/request_body.h"
#include "server/routes.h"
#include "tensor/caching_allocator.h"
#include "base/json_text.h"

namespace cubevec::server {

namespace {

constexpr auto kSseHeartbeat = std::chrono::seconds(10);  // a comment line keeps proxies from closing an idle stream

std::shared_ptr<Job> job_or_404(ServerContext& context, const std::string& id, const char* kind) {
  std::shared_ptr<Job> job = context.scheduler.find(id);
  if (!job)
    throw not_found(std::string("no ") + kind + " '" + id + "' on this server (finished ones are kept for the last --keep-jobs only)");
  return job;
}

// The video routes serve video jobs only (of /v1/videos or /v1/jobs on a video model).
std::shared_ptr<Job> video_or_404(ServerContext& context, const std::string& id) {
  std::shared_ptr<Job> job = job_or_404(context, id, "video");
  if (!job->video()) throw not_found("'" + id + "' is a picture job, not a video: use /v1/jobs/" + id);
  return job;
}

nlohmann::ordered_json error_json(const JobSnapshot& s) { return s.error ? s.error->to_json()["error"] : nlohmann::ordered_json(nullptr); }

// The native job object.
nlohmann::ordered_json job_json(const Job& job, const std::string& base) {
  const JobSnapshot s = job.snapshot();
  nlohmann::ordered_json j{
      {"id", job.id()}, {"object", "job"},  {"model", job.model()},   {"status", status_name(s.status)}, {"stage", s.stage},
      {"step", s.step}, {"steps", s.steps}, {"progress", s.progress}, {"created_at", s.created_at}};
  j["eta_s"] = s.eta_s ? nlohmann::ordered_json(*s.eta_s) : nlohmann::ordered_json(nullptr);
  j["started_at"] = s.started_at ? nlohmann::ordered_json(s.started_at) : nlohmann::ordered_json(nullptr);
  j["completed_at"] = s.completed_at ? nlohmann::ordered_json(s.completed_at) : nlohmann::ordered_json(nullptr);
  j["seconds"] = s.seconds;
  j["request"] = job.request().to_json();
  j["error"] = error_json(s);
  if (s.status == JobStatus::completed) {
    // The picture (PNG) or the video (AVI).
    const nlohmann::ordered_json urls = nlohmann::ordered_json::array({base + "/v1/jobs/" + job.id() + "/content"});
    j["result"] = {{"outputs", s.outputs},
                   {"urls", urls},
                   {"frames_url", base + "/v1/jobs/" + job.id() + "/frames/"},  // + "0.png" ... each output as PNG
                   {"report", job.report()}};
  } else {
    j["result"] = nullptr;
  }
  return j;
}

// OpenAI's video object (progress in percent, as the video APIs give it).
nlohmann::ordered_json video_json(const Job& job, int fps) {
  const JobSnapshot s = job.snapshot();
  nlohmann::ordered_json j{{"id", job.id()},
                           {"object", "video"},
                           {"model", job.model()},
                           {"status", status_name(s.status)},
                           {"progress", static_cast<int>(s.progress * 100)},
                           {"created_at", s.created_at}};
  j["completed_at"] = s.completed_at ? nlohmann::ordered_json(s.completed_at) : nlohmann::ordered_json(nullptr);
  const pipelines::Request& r = job.request();
  j["size"] = std::to_string(*r.width) + "x" + std::to_string(*r.height);
  j["num_frames"] = r.num_frames ? nlohmann::ordered_json(*r.num_frames) : nlohmann::ordered_json(nullptr);
  j["seconds"] = r.num_frames ? number_for_message(static_cast<double>(*r.num_frames) / fps) : "0";
  j["seed"] = r.seed;
  j["error"] = error_json(s);
  return j;
}

std::string avi_of(const Job& job) {
  const auto images = job.images();
  const std::vector<media::RgbImage>& frames = *images;
  if (frames.empty()) throw ApiError(500, "server_error", "no_frames", "", "the job '" + job.id() + "' finished without frames");
  std::vector<uint8_t> bytes;
  media::MjpegAviWriter writer(bytes, job.id() + ".avi", frames.front().width, frames.front().height, job.fps());
  for (const media::RgbImage& frame : frames) writer.add_frame(frame, 90);
  writer.finish();
  return std::string(bytes.begin(), bytes.end());
}

void require_completed(const Job& job) {
  const JobSnapshot s = job.snapshot();
  if (s.status != JobStatus::completed)
    throw ApiError(409, "invalid_request_error", "not_ready", "",
                   "the job '" + job.id() + "' is " + status_name(s.status) + ", not completed");
}

void send_content(const Job& job, httplib::Response& response, int index) {
  require_completed(job);
  if (job.video()) {
    response.set_header("Content-Disposition", "inline; filename=\"" + job.id() + ".avi\"");
    response.set_content(avi_of(job), "video/x-msvideo");
    return;
  }
  const auto images = job.images();
  if (index < 0 || index >= static_cast<int>(images->size()))
    throw not_found("the job '" + job.id() + "' has no output " + std::to_string(index));
  response.set_content(encoded_image((*images)[static_cast<std::size_t>(index)], "png", 92, job.id()), "image/png");
}

// One picture of a job, or one frame of its video, as PNG.
void send_frame(const Job& job, httplib::Response& response, const std::string& index_text) {
  require_completed(job);
  const auto images = job.images();
  const int index = std::stoi(index_text);  // at most 6 digits (the route's pattern)
  if (index >= static_cast<int>(images->size()))
    throw not_found("the job '" + job.id() + "' has " + std::to_string(images->size()) + " output(s); there is no " + index_text);
  response.set_content(encoded_image((*images)[static_cast<std::size_t>(index)], "png", 92, job.id() + " output " + index_text),
                       "image/png");
}

// Server-Sent Events: each job event as "event: NAME" + "data: JSON"; the last one carries the
// finished job object.
void stream_events(ServerContext& context, const httplib::Request& request, httplib::Response& response) {
  std::shared_ptr<Job> job = job_or_404(context, request.matches[1], "job");
  const std::string base = base_url(request);
  const int max_streams = std::max(1, context.limits.http_threads / 2);
  if (context.event_streams.fetch_add(1) >= max_streams) {
    --context.event_streams;
    throw ApiError(429, "rate_limit_error", "too_many_streams", "",
                   "this server has " + std::to_string(max_streams) +
                       " event streams open, its most (half of --http-threads); poll GET /v1/jobs/" + job->id() +
                       " instead, or retry later");
  }
  auto next = std::make_shared<std::size_t>(0);
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider(
      "text/event-stream",
      [job, base, next](std::size_t, httplib::DataSink& sink) {
        bool done = false;
        const std::vector<JobEvent> events = job->events_from(*next, std::chrono::steady_clock::now() + kSseHeartbeat, done);
        std::string text;
        for (const JobEvent& event : events) {
          const bool last = event.name == "completed" || event.name == "failed" || event.name == "cancelled";
          nlohmann::ordered_json data = event.data;
          if (last) data = job_json(*job, base);
          text += "event: " + event.name + "\ndata: " + dump_json(data) + "\n\n";
        }
        if (events.empty()) text = ": keep-alive\n\n";
        *next += events.size();
        if (!sink.is_writable() || !sink.write(text.data(), text.size())) return false;
        if (done) sink.done();
        return true;
      },
      [&context](bool) { --context.event_streams; });
}

std::string prometheus_text(ServerContext& context) {
  std::string out;
  const auto metric = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  const auto number = [](double v) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.9g", v);
    return std::string(buffer);
  };
  const std::vector<ModelStats> stats = context.scheduler.stats();
  const auto per_model = [&](const char* name, const char* type, const char* help, auto value) {
    metric(name, type, help);
    for (const ModelStats& m : stats) out += std::string(name) + "{model=\"" + m.name + "\"} " + number(value(m)) + "\n";
  };
  per_model("cubevec_queue_depth", "gauge", "Requests waiting for an instance.", [](const ModelStats& m) { return m.queued; });
  per_model("cubevec_running", "gauge", "Requests running now.", [](const ModelStats& m) { return m.running; });
  per_model("cubevec_instances", "gauge", "Instances (concurrent requests) per model.", [](const ModelStats& m) { return m.instances; });
  metric("cubevec_requests_total", "counter", "Finished requests by outcome.");
  for (const ModelStats& m : stats)
    for (const auto& [status, count] :
         {std::pair{"completed", m.completed}, {"failed", m.failed}, {"cancelled", m.cancelled}, {"rejected", m.rejected}})
      out += "cubevec_requests_total{model=\"" + m.name + "\",status=\"" + status + "\"} " + std::to_string(count) + "\n";
  metric("cubevec_request_latency_seconds", "histogram", "Time from queueing to the result, completed requests.");
  for (const ModelStats& m : stats) {
    for (std::size_t i = 0; i < kLatencyBuckets.size(); ++i)
      out += "cubevec_request_latency_seconds_bucket{model=\"" + m.name + "\",le=\"" + number(kLatencyBuckets[i]) + "\"} " +
             std::to_string(m.latency_buckets[i]) + "\n";
    out += "cubevec_request_latency_seconds_bucket{model=\"" + m.name + "\",le=\"+Inf\"} " + std::to_string(m.completed) + "\n";
    out += "cubevec_request_latency_seconds_sum{model=\"" + m.name + "\"} " + number(m.latency_sum) + "\n";
    out += "cubevec_request_latency_seconds_count{model=\"" + m.name + "\"} " + std::to_string(m.completed) + "\n";
  }
  per_model("cubevec_denoising_steps_total", "counter", "Denoising steps of completed requests.",
            [](const ModelStats& m) { return double(m.denoising_steps); });
  per_model("cubevec_denoising_seconds_total", "counter", "Wall time those steps took.",
            [](const ModelStats& m) { return m.denoising_seconds; });
  per_model("cubevec_denoising_steps_per_second", "gauge", "Denoising steps per second of one request, over all completed ones.",
            [](const ModelStats& m) { return m.denoising_seconds > 0 ? double(m.denoising_steps) / m.denoising_seconds : 0.0; });
  const AllocatorStats allocator = default_allocator().stats();
  metric("cubevec_allocator_live_bytes", "gauge", "Bytes in tensors now.");
  out += "cubevec_allocator_live_bytes " + std::to_string(allocator.live_bytes) + "\n";
  metric("cubevec_allocator_reserved_bytes", "gauge", "Bytes the tensor allocator holds from the system (live + cached).");
  out += "cubevec_allocator_reserved_bytes " + std::to_string(allocator.reserved_bytes) + "\n";
  metric("process_resident_memory_bytes", "gauge", "Resident memory of the process.");
  long pages = 0, resident = 0;
  if (std::ifstream statm("/proc/self/statm"); statm >> pages >> resident)
    out += "process_resident_memory_bytes " + std::to_string(resident * ::sysconf(_SC_PAGESIZE)) + "\n";
  return out;
}

// An image-to-video request's pictures from its multipart form: the first frame as OpenAI's
// `input_reference` (or `image`), the last one (first-last-frame) as `last_image`.
Uploads video_uploads(const httplib::Request& request) {
  Uploads uploads;
  const std::size_t firsts = request.files.count("input_reference") + request.files.count("image");
  if (firsts > 1) throw invalid_request("input_reference", "one first frame per request: give 'input_reference' (or 'image') once");
  if (firsts == 1) {
    const std::string field = request.has_file("input_reference") ? "input_reference" : "image";
    uploads.image = decode_upload(request.get_file_value(field).content, field);
  }
  if (request.files.count("last_image") > 1) throw invalid_request("last_image", "one 'last_image' per request");
  if (request.has_file("last_image")) {
    if (!uploads.image) throw invalid_request("last_image", "'last_image' (the last frame) needs the first frame too ('input_reference')");
    uploads.last_image = decode_upload(request.get_file_value("last_image").content, "last_image");
  }
  return uploads;
}

void submit_job(ServerContext& context, const httplib::Request& request, httplib::Response& response, bool video_api) {
  // POST /v1/videos also takes a multipart form: OpenAI's fields and the pictures as files.
  const bool form = video_api && request.is_multipart_form_data();
  const nlohmann::json body = form ? form_fields(request, {"input_reference", "image", "last_image"})
                                   : parse_body(request.body, request.get_header_value("Content-Type"));
  const Uploads uploads = form ? video_uploads(request) : Uploads{};
  const std::string model_name = string_field(body, "model", {}, 256).value_or("");
  const ServedModel& model = context.scheduler.model(model_name);
  nlohmann::json keys;
  if (video_api) {
    // OpenAI's video fields, then the diffusion settings.
    const std::optional<std::string> prompt = string_field(body, "prompt");
    if (!prompt || prompt->empty())
      throw invalid_request("prompt", "'prompt' is required: a non-empty string", "missing_required_parameter");
    keys["prompt"] = *prompt;
    if (const auto size = size_field(body, "size", context.limits.max_side)) keys["width"] = size->first, keys["height"] = size->second;
    copy_diffusion_keys(body, keys);
    // OpenAI's video APIs send "seconds" as a string ("4"); numbers are taken too.
    std::optional<double> seconds;
    if (const auto it = body.find("seconds"); it != body.end() && !it->is_null()) {
      nlohmann::json number = *it;
      if (it->is_string()) {
        const std::string text = it->get<std::string>();
        char* end = nullptr;
        const double value = text.size() < 32 ? std::strtod(text.c_str(), &end) : 0;
        if (text.empty() || text.size() >= 32 || end != text.c_str() + text.size())
          throw invalid_request("seconds", "'seconds' must be a number of seconds (\"4\" or 4), got \"" + text.substr(0, 40) + "\"");
        number = value;
      }
      seconds = number_field(nlohmann::json{{"seconds", number}}, "seconds", 0.0625, 3600.0);
    }
    if (seconds && keys.contains("num_frames")) throw invalid_request("seconds", "give 'seconds' or 'num_frames', not both");
    if (seconds) {
      // 1 + 4k frames (Wan's VAE), at the server's frame rate.
      const int64_t frames = 1 + 4 * std::max<int64_t>(0, std::llround(*seconds * context.scheduler.options().video_fps / 4.0));
      if (frames > context.limits.max_frames)
        throw invalid_request("seconds", "'seconds' " + number_for_message(*seconds) + " is " + std::to_string(frames) + " frames at " +
                                             std::to_string(context.scheduler.options().video_fps) + " fps; this server makes at most " +
                                             std::to_string(context.limits.max_frames) + " (--max-frames)");
      keys["num_frames"] = frames;
    }
    if (!keys.contains("seed")) keys["seed"] = random_seed();
  } else {
    // The library's request JSON as it is, plus "model".
    keys = body;
    keys.erase("model");
    refuse_file_keys(keys);
  }
  const pipelines::Request checked = [&] {
    try {
      return checked_request(keys, model, context.limits, video_api ? true : model.pipeline->model().video(), uploads);
    } catch (const ApiError& e) {
      // OpenAI's video API names the first frame input_reference.
      if (video_api && e.param() == "image") throw ApiError(e.status(), e.type(), e.code(), "input_reference", e.what());
      throw;
    }
  }();
  const std::shared_ptr<Job> job = context.scheduler.submit(model.name, {checked}, video_api ? "video" : "native").front();
  send_json(response, video_api ? 200 : 202,
            video_api ? video_json(*job, context.scheduler.options().video_fps) : job_json(*job, base_url(request)));
}

void delete_job(ServerContext& context, const httplib::Request& request, httplib::Response& response, bool video_api) {
  const std::shared_ptr<Job> job = video_api ? video_or_404(context, request.matches[1]) : job_or_404(context, request.matches[1], "job");
  const JobSnapshot s = job->snapshot();
  if (finished(s.status)) {
    if (video_api) {
      // OpenAI's DELETE removes a finished video.
      context.scheduler.forget(job->id());
      send_json(response, 200, {{"id", job->id()}, {"object", "video.deleted"}, {"deleted", true}});
      return;
    }
    throw ApiError(409, "invalid_request_error", "already_finished", "",
                   "the job '" + job->id() + "' has already finished (" + status_name(s.status) + "); there is nothing to cancel");
  }
  context.scheduler.cancel(*job);
  send_json(response, 202, video_api ? video_json(*job, context.scheduler.options().video_fps) : job_json(*job, base_url(request)));
}

}  // namespace

void add_job_routes(httplib::Server& http, ServerContext& context) {
  add_route(http, context, "POST", "/v1/jobs",
            answering_errors([&](const httplib::Request& q, httplib::Response& r) { submit_job(context, q, r, false); }));
  add_route(http, context, "GET", R"(/v1/jobs/([A-Za-z0-9_]+))", answering_errors([&](const httplib::Request& q, httplib::Response& r) {
              send_json(r, 200, job_json(*job_or_404(context, q.matches[1], "job"), base_url(q)));
            }));
  add_route(http, context, "GET", R"(/v1/jobs/([A-Za-z0-9_]+)/events)",
            answering_errors([&](const httplib::Request& q, httplib::Response& r) { stream_events(context, q, r); }));
  add_route(http, context, "GET", R"(/v1/jobs/([A-Za-z0-9_]+)/content)",
            answering_errors(
                [&](const httplib::Request& q, httplib::Response& r) { send_content(*job_or_404(context, q.matches[1], "job"), r, 0); }));
  add_route(http, context, "GET", R"(/v1/jobs/([A-Za-z0-9_]+)/frames/([0-9]{1,6})\.png)",
            answering_errors([&](const httplib::Request& q, httplib::Response& r) {
              send_frame(*job_or_404(context, q.matches[1], "job"), r, q.matches[2]);
            }));
  add_route(http, context, "DELETE", R"(/v1/jobs/([A-Za-z0-9_]+))",
            answering_errors([&](const httplib::Request& q, httplib::Response& r) { delete_job(context, q, r, false); }));
  add_route(http, context, "GET", "/health", answering_errors([&](const httplib::Request&, httplib::Response& r) {
              const std::string broken = context.scheduler.broken();
              const bool up = context.scheduler.accepting() && broken.empty();
              nlohmann::ordered_json health{{"status", !broken.empty() ? "failed"
                                                       : up            ? "ok"
                                                                       : "shutting_down"},
                                            {"models", context.scheduler.models().size()}};
              if (!broken.empty()) health["reason"] = broken;
              send_json(r, up ? 200 : 503, health);
            }));
  add_route(http, context, "GET", "/metrics", answering_errors([&](const httplib::Request&, httplib::Response& r) {
              r.set_content(prometheus_text(context), "text/plain; version=0.0.4");
            }));
}

void add_video_routes(httplib::Server& http, ServerContext& context) {
  add_route(http, context, "POST", "/v1/videos",
            answering_errors([&](const httplib::Request& q, httplib::Response& r) { submit_job(context, q, r, true); }));
  add_route(http, context, "GET", R"(/v1/videos/([A-Za-z0-9_]+))", answering_errors([&](const httplib::Request& q, httplib::Response& r) {
              send_json(r, 200, video_json(*video_or_404(context, q.matches[1]), context.scheduler.options().video_fps));
            }));
  add_route(
      http, context, "GET", R"(/v1/videos/([A-Za-z0-9_]+)/content)",
      answering_errors([&](const httplib::Request& q, httplib::Response& r) { send_content(*video_or_404(context, q.matches[1]), r, 0); }));
  add_route(http, context, "DELETE", R"(/v1/videos/([A-Za-z0-9_]+))",
            answering_errors([&](const httplib::Request& q, httplib::Response& r) { delete_job(context, q, r, true); }));
}

}  // namespace cubevec::server
