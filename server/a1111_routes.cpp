// The AUTOMATIC1111 web UI's API, the subset image tools call: txt2img, img2img (init_images,
// mask, denoising_strength: Flux image-to-image and inpainting), progress, interrupt and the model
// list. Its fields map onto the library's request: steps -> num_inference_steps, cfg_scale ->
// guidance_scale, seed -1 -> a random seed; batch_size x n_iter pictures with seeds seed, seed + 1...
// cubevec's own request keys (lora, cfg, cache, sparse, quant_attention...) are taken as well.
#include <optional>
#include <string>
#include <vector>

#include "server/request_body.h"
#include "tokenizers/t5_tokenizer_json.h"
#include "server/routes.h"
#include "base/json_text.h"

namespace cubevec::server {

namespace {

// A picture sent as base64 (a data URL's "data:image/png;base64," prefix allowed) decoded.
std::shared_ptr<const media::RgbImage> base64_picture(const nlohmann::json& value, const std::string& param) {
  if (!value.is_string()) throw invalid_request(param, "'" + param + "' must be a base64 string (a PNG or JPEG)", "invalid_type");
  std::string text = value.get<std::string>();
  if (text.rfind("data:", 0) == 0) {
    const std::size_t comma = text.find(',');
    if (comma == std::string::npos || text.substr(0, comma).find(";base64") == std::string::npos)
      throw invalid_request(param, "'" + param + "' is a data URL without ';base64,'", "invalid_image");
    text = text.substr(comma + 1);
  }
  std::string bytes;
  try {
    bytes = tokenizers::decode_base64(text);  // standard base64, padded, as the web UI sends it
  } catch (const Error& e) {
    throw invalid_request(param, "'" + param + "' is not base64: " + e.what(), "invalid_image");
  }
  return decode_upload(bytes, param);
}

void generate(ServerContext& context, const httplib::Request& http_request, httplib::Response& response, bool img2img) {
  const nlohmann::json body = parse_body(http_request.body, http_request.get_header_value("Content-Type"));
  refuse_file_keys(body);
  Uploads uploads;
  if (img2img) {
    const auto images = body.find("init_images");
    if (images == body.end() || !images->is_array() || images->empty())
      throw invalid_request("init_images", "'init_images' is required: a list with one base64 picture", "missing_required_parameter");
    if (images->size() > 1) throw invalid_request("init_images", "one picture in 'init_images' per request: this server edits one");
    uploads.image = base64_picture(images->front(), "init_images");
    if (const auto mask = body.find("mask"); mask != body.end() && !mask->is_null()) {
      uploads.mask = base64_picture(*mask, "mask");
      if (uploads.mask->width != uploads.image->width || uploads.mask->height != uploads.image->height)
        throw invalid_request("mask", "the mask must have the picture's size, " + std::to_string(uploads.image->width) + "x" +
                                          std::to_string(uploads.image->height));
    }
  }
  const std::string prompt = string_field(body, "prompt").value_or("");
  if (prompt.empty())
    throw invalid_request("prompt", "'prompt' is required: a non-empty string (cubevec's models need a prompt)",
                          "missing_required_parameter");
  const int max_n = context.limits.max_n;
  const int64_t batch_size = integer_field(body, "batch_size", 1, max_n).value_or(1);
  const int64_t n_iter = integer_field(body, "n_iter", 1, max_n).value_or(1);
  if (batch_size * n_iter > max_n)
    throw invalid_request("n_iter", "batch_size x n_iter is " + std::to_string(batch_size * n_iter) +
                                        " pictures; this server makes at most " + std::to_string(max_n) + " a request (--max-n)");
  const int64_t seed = integer_field(body, "seed", -1, INT64_MAX - 64).value_or(-1);
  // override_settings.sd_model_checkpoint picks the model, as in the web UI.
  const std::string checkpoint = "override_settings.sd_model_checkpoint";
  const std::string model_name = [&] {
    const auto it = body.find("override_settings");
    if (it == body.end() || it->is_null()) return std::string();
    if (!it->is_object()) throw invalid_request("override_settings", "'override_settings' must be an object", "invalid_type");
    const auto name = it->find("sd_model_checkpoint");
    if (name == it->end() || name->is_null()) return std::string();
    if (!name->is_string()) throw invalid_request(checkpoint, "'" + checkpoint + "' must be a string (a model's name)", "invalid_type");
    return name->get<std::string>().substr(0, 256);
  }();
  const ServedModel& model = context.scheduler.model(model_name, checkpoint);
  nlohmann::json keys{{"prompt", prompt}, {"seed", seed < 0 ? random_seed() : static_cast<uint64_t>(seed)}};
  if (const auto negative = string_field(body, "negative_prompt"); negative && !negative->empty()) keys["negative_prompt"] = *negative;
  if (const auto steps = integer_field(body, "steps", 1, context.limits.max_steps)) keys["num_inference_steps"] = *steps;
  if (const auto cfg = number_field(body, "cfg_scale", 0.0, 100.0)) keys["guidance_scale"] = *cfg;
  if (const auto width = integer_field(body, "width", 16, context.limits.max_side)) keys["width"] = *width;
  if (const auto height = integer_field(body, "height", 16, context.limits.max_side)) keys["height"] = *height;
  // NAME[:SCALE] of --lora-dir's, a Kontext edit's settings and cubevec's stages (CFG mode, step
  // cache, sparse and int8 attention): as the library reads them (the web UI sends none of these).
  for (const char* key : {"lora", "max_area", "auto_resize", "cfg", "cache", "sparse", "quant_attention"})
    if (const auto it = body.find(key); it != body.end() && !it->is_null()) keys[key] = *it;
  // The web UI's default strength is 0.75; a Kontext model edits the picture instead (no strength).
  const std::optional<double> strength = number_field(body, "denoising_strength", 0.0, 1.0);
  if (img2img && (strength || !model.pipeline->model().edits_pictures())) keys["strength"] = strength.value_or(0.75);
  const pipelines::Request first = [&] {
    try {
      return checked_request(keys, model, context.limits, /*video_route=*/false, uploads);
    } catch (const ApiError& e) {
      // The library's keys as this route names them.
      if (e.param() == "model") throw ApiError(e.status(), e.type(), e.code(), checkpoint, e.what());
      if (e.param() == "strength") throw ApiError(e.status(), e.type(), e.code(), "denoising_strength", e.what());
      throw;
    }
  }();
  std::vector<pipelines::Request> requests(static_cast<std::size_t>(batch_size * n_iter), first);
  for (std::size_t i = 0; i < requests.size(); ++i) requests[i].seed = first.seed + i;
  const std::vector<std::shared_ptr<Job>> jobs = context.scheduler.submit(model.name, requests, "a1111");
  for (const auto& job : jobs) job->wait_finished(std::chrono::steady_clock::time_point::max());

  // As the web UI: an interrupted batch answers with the pictures finished before the interrupt.
  nlohmann::ordered_json images = nlohmann::ordered_json::array(), seeds = nlohmann::ordered_json::array();
  bool interrupted = false;
  for (const auto& job : jobs) {
    const JobSnapshot s = job->snapshot();
    if (s.status == JobStatus::failed && s.error) throw *s.error;
    if (s.status == JobStatus::cancelled) {
      interrupted = true;
      continue;
    }
    images.push_back(base64(encoded_image(job->images()->at(0), "png", 92, job->id())));
    seeds.push_back(job->request().seed);
  }
  nlohmann::ordered_json info{
      {"prompt", prompt},
      {"negative_prompt", first.text.negative_prompt},
      {"seed", first.seed},
      {"all_seeds", seeds},
      {"width", *first.width},
      {"height", *first.height},
      {"steps", *first.num_inference_steps},
      {"cfg_scale", first.guidance_scale ? nlohmann::ordered_json(*first.guidance_scale) : nlohmann::ordered_json(nullptr)},
      {"sd_model_name", model.name},
      {"batch_size", batch_size},
      {"interrupted", interrupted}};
  send_json(response, 200, {{"images", images}, {"parameters", body}, {"info", dump_json(info)}});
}

void progress(ServerContext& context, httplib::Response& response) {
  const std::vector<std::shared_ptr<Job>> jobs = context.scheduler.unfinished("a1111");
  nlohmann::ordered_json state{{"skipped", false},     {"interrupted", false}, {"job", ""},          {"job_count", jobs.size()},
                               {"job_timestamp", "0"}, {"job_no", 0},          {"sampling_step", 0}, {"sampling_steps", 0}};
  double fraction = 0, eta = 0;
  for (const auto& job : jobs) {
    const JobSnapshot s = job->snapshot();
    if (s.status != JobStatus::in_progress) continue;
    state["job"] = job->id();
    state["sampling_step"] = s.step;
    state["sampling_steps"] = s.steps;
    state["interrupted"] = job->cancel_requested();
    fraction = s.progress;
    eta = s.eta_s.value_or(0);
    break;
  }
  send_json(response, 200,
            {{"progress", fraction}, {"eta_relative", eta}, {"state", state}, {"current_image", nullptr}, {"textinfo", nullptr}});
}

}  // namespace

void add_a1111_routes(httplib::Server& http, ServerContext& context) {
  add_route(http, context, "POST", "/sdapi/v1/txt2img",
            answering_errors([&](const httplib::Request& q, httplib::Response& r) { generate(context, q, r, false); }));
  add_route(http, context, "POST", "/sdapi/v1/img2img",
            answering_errors([&](const httplib::Request& q, httplib::Response& r) { generate(context, q, r, true); }));
  add_route(http, context, "GET", "/sdapi/v1/progress",
            answering_errors([&](const httplib::Request&, httplib::Response& r) { progress(context, r); }));
  add_route(http, context, "POST", "/sdapi/v1/interrupt", answering_errors([&](const httplib::Request&, httplib::Response& r) {
              const std::vector<std::shared_ptr<Job>> jobs = context.scheduler.unfinished("a1111");
              for (const auto& job : jobs) context.scheduler.cancel(*job);
              send_json(r, 200, {{"interrupted", jobs.size()}});
            }));
  add_route(http, context, "GET", "/sdapi/v1/sd-models", answering_errors([&](const httplib::Request&, httplib::Response& r) {
              nlohmann::ordered_json models = nlohmann::ordered_json::array();
              for (const ServedModel* m : context.scheduler.models())
                models.push_back({{"title", m->name},
                                  {"model_name", m->name},
                                  {"hash", nullptr},
                                  {"sha256", nullptr},
                                  {"filename", m->name},
                                  {"config", nullptr}});
              send_json(r, 200, models);
            }));
}

}  // namespace cubevec::server
