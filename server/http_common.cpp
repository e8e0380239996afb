#include "server/http_common.h"

#include <filesystem>
#include <new>
#include <random>
#include <set>
#include <sstream>

#include "base/error.h"
#include "media/image_input.h"
#include "models/lora.h"
#include "server/request_body.h"
#include "base/json_text.h"

namespace cubevec::server {

void send_json(httplib::Response& response, int status, const nlohmann::ordered_json& body) {
  response.status = status;
  // Invalid UTF-8 from a request (echoed in a message) is replaced, never a throw mid-response.
  response.set_content(dump_json(body), "application/json");
}

void send_error(httplib::Response& response, const ApiError& error) {
  if (error.status() == 429 || error.status() == 503) response.set_header("Retry-After", "1");
  send_json(response, error.status(), error.to_json());
}

Handler answering_errors(Handler handler) {
  return [handler = std::move(handler)](const httplib::Request& request, httplib::Response& response) {
    try {
      handler(request, response);
    } catch (const ApiError& e) {
      send_error(response, e);
    } catch (const std::bad_alloc&) {
      send_error(response, ApiError(507, "server_error", "out_of_memory", "", "the server ran out of memory for this request"));
    } catch (const Error& e) {
      send_error(response, from_library_error(e.what()));
    } catch (const std::exception& e) {
      send_error(response, ApiError(500, "server_error", "internal_error", "", std::string("internal error: ") + e.what()));
    }
  };
}

void add_route(httplib::Server& http, ServerContext& context, const std::string& method, const std::string& pattern, Handler handler) {
  context.routes.emplace_back(method, std::regex(pattern));
  if (method == "GET") http.Get(pattern, std::move(handler));
  else if (method == "POST") http.Post(pattern, std::move(handler));
  else if (method == "DELETE") http.Delete(pattern, std::move(handler));
  else throw std::logic_error("add_route: method " + method);
}

std::string allowed_methods(const ServerContext& context, const std::string& path) {
  std::string methods;
  for (const auto& [method, pattern] : context.routes)
    if (std::regex_match(path, pattern) && methods.find(method) == std::string::npos) methods += (methods.empty() ? "" : ", ") + method;
  return methods;
}

void refuse_file_keys(const nlohmann::json& body) {
  // A path in a request would make the server read a file a client names: never.
  for (const auto& [key, instead] : {std::pair<const char*, const char*>{"prompt_embeds", "send 'prompt'"},
                                     {"image", "images go in as uploads, not paths"},
                                     {"mask_image", "images go in as uploads, not paths"},
                                     {"last_image", "images go in as uploads, not paths"},
                                     {"input_reference", "the first frame goes in as a multipart upload, not a path or text"}})
    if (const auto it = body.find(key); it != body.end() && !it->is_null())
      throw invalid_request(key, std::string("'") + key + "' names a file, and this server reads no file a request names; " + instead);
}

std::vector<std::string> served_lora_files(const std::vector<std::string>& names, const std::string& lora_dir) {
  if (names.empty()) return {};
  if (lora_dir.empty())
    throw invalid_request("lora", "this server applies no LoRA a request names (start it with --lora-dir FOLDER to allow the files there)");
  // A plain file name in --lora-dir and nothing else: no folders, no "..", no link out of it.
  std::vector<std::string> files;
  for (const std::string& item : names) {
    const auto [name, scale] = models::parse_lora_flag(item);
    const bool plain = !name.empty() && name.find('/') == std::string::npos && name.find('\\') == std::string::npos && name[0] != '.' &&
                       name.size() <= 255;
    const std::filesystem::path path = std::filesystem::path(lora_dir) / name;
    std::error_code error;
    if (!plain || !std::filesystem::is_regular_file(std::filesystem::symlink_status(path, error)))
      throw invalid_request("lora", "'" + name + "' is not a LoRA file of this server's --lora-dir (give a file name from that folder)",
                            "unknown_lora");
    std::ostringstream scale_text;
    scale_text.precision(17);
    scale_text << scale;
    files.push_back(path.string() + ":" + scale_text.str());
  }
  return files;
}

void copy_diffusion_keys(const nlohmann::json& body, nlohmann::json& request_keys) {
  refuse_file_keys(body);
  for (const char* key :
       {"negative_prompt", "num_inference_steps", "guidance_scale", "true_cfg_scale", "seed", "cfg", "cache", "sparse",
        "max_sequence_length", "num_frames", "strength", "lora", "edit", "max_area", "auto_resize", "guidance_scale_2", "quant_attention"})
    if (const auto it = body.find(key); it != body.end() && !it->is_null()) request_keys[key] = *it;
}

pipelines::Request checked_request(const nlohmann::json& request_keys, const ServedModel& model, const ServeLimits& limits,
                                   bool video_route, const Uploads& uploads) {
  const pipelines::ModelPipeline& family = model.pipeline->model();
  if (family.video() != video_route)
    throw invalid_request(
        "model",
        "the model '" + model.name + "' makes " +
            (family.video() ? "videos: use POST /v1/videos or /v1/jobs" : "pictures: use POST /v1/images/generations or /v1/jobs"),
        "wrong_model_kind");
  if (!family.video() && request_keys.contains("num_frames"))
    throw invalid_request("num_frames", "'num_frames' applies to video models; the model '" + model.name + "' makes pictures");
  pipelines::Request request;
  try {
    request = pipelines::Request::from_json(request_keys, "request");
  } catch (const Error& e) {
    throw from_library_error(e.what());
  }
  request.image_pixels = uploads.image;
  request.mask_pixels = uploads.mask;
  request.last_image_pixels = uploads.last_image;
  request.lora = served_lora_files(request.lora, limits.lora_dir);
  try {
    request = model.pipeline->checked(request);
  } catch (const Error& e) {
    throw from_library_error(e.what());
  }
  const auto over = [](const std::string& key, int64_t value, int64_t max, const std::string& flag) {
    if (value > max)
      throw invalid_request(
          key, "'" + key + "' is " + std::to_string(value) + "; this server takes at most " + std::to_string(max) + " (" + flag + ")");
  };
  over("num_inference_steps", *request.num_inference_steps, limits.max_steps, "--max-steps");
  over("width", *request.width, limits.max_side, "--max-size");
  over("height", *request.height, limits.max_side, "--max-size");
  if (request.num_frames) over("num_frames", *request.num_frames, limits.max_frames, "--max-frames");
  return request;
}

std::shared_ptr<const media::RgbImage> decode_upload(const std::string& bytes, const std::string& param, std::vector<uint8_t>* alpha) {
  try {
    return std::make_shared<const media::RgbImage>(
        media::decode_input_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "the upload '" + param + "'", alpha));
  } catch (const Error& e) {
    throw invalid_request(param, e.what(), "invalid_image");
  }
}

uint64_t random_seed() {
  static thread_local std::mt19937_64 engine{std::random_device{}()};
  return engine() >> 1;  // a non-negative int64, as requests carry it
}

void wait_all(const std::vector<std::shared_ptr<Job>>& jobs) {
  for (const auto& job : jobs) job->wait_finished(std::chrono::steady_clock::time_point::max());
  for (const auto& job : jobs) {
    const JobSnapshot s = job->snapshot();
    if (s.status == JobStatus::failed && s.error) throw *s.error;
    if (s.status == JobStatus::cancelled)
      throw ApiError(503, "server_error", "cancelled", "",
                     "the request was cancelled before it finished (" + std::string(s.error ? s.error->what() : "") + ")");
  }
}

std::string base_url(const httplib::Request& request) {
  std::string host = request.get_header_value("Host");
  // Only what a host name and port may hold: the URL goes back into a JSON response.
  for (const char c : host)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == ':' || c == '-' || c == '[' || c == ']')) return "";
  return host.empty() ? "" : "http://" + host;
}

nlohmann::json form_fields(const httplib::Request& http_request, const std::set<std::string>& file_fields) {
  static const std::set<std::string> numbers = {
      "n",    "output_compression", "num_inference_steps", "guidance_scale", "guidance_scale_2", "true_cfg_scale",
      "seed", "strength",           "max_sequence_length", "max_area",       "num_frames"};
  static const std::set<std::string> booleans = {"edit", "auto_resize"};
  static const std::set<std::string> texts = {"prompt",          "model",      "size",    "response_format", "output_format",
                                              "negative_prompt", "cfg",        "cache",   "sparse",          "user",
                                              "quality",         "background", "seconds", "quant_attention"};
  nlohmann::json body = nlohmann::json::object();
  nlohmann::json named_files = nlohmann::json::object();  // file names sent as text: refused as in a JSON body
  for (const char* key : {"prompt_embeds", "mask_image", "last_image"})
    if (!file_fields.count(key) && http_request.has_file(key)) named_files[key] = http_request.get_file_value(key).content;
  refuse_file_keys(named_files);
  for (const auto& [name, item] : http_request.files) {
    const bool file = file_fields.count(name) != 0;
    if (!file && http_request.files.count(name) > 1)
      throw invalid_request(name, "'" + name.substr(0, 64) + "' is given more than once in the form");
    if (file) {
      if (item.filename.empty()) throw invalid_request(name, "'" + name + "' must be a file (a PNG or JPEG upload), got a text field");
      continue;
    }
    if (!item.filename.empty()) throw invalid_request(name, "'" + name + "' must be a text field, got a file");
    // A NUL would end the text early for the number parser and the messages ("5\0-1" read as 5).
    if (item.content.find('\0') != std::string::npos)
      throw invalid_request(name, "'" + utf8_or_escaped(name.substr(0, 64)) + "' holds a NUL character", "invalid_value");
    if (numbers.count(name)) {
      try {
        body[name] = nlohmann::json::parse(item.content);
      } catch (const nlohmann::json::exception&) {
        throw invalid_request(name, "'" + name + "' must be a number, got '" + item.content.substr(0, 64) + "'", "invalid_type");
      }
      if (!body[name].is_number()) throw invalid_request(name, "'" + name + "' must be a number", "invalid_type");
    } else if (booleans.count(name)) {
      if (item.content != "true" && item.content != "false")
        throw invalid_request(name, "'" + name + "' must be true or false, got '" + item.content.substr(0, 64) + "'", "invalid_type");
      body[name] = item.content == "true";
    } else if (texts.count(name)) {
      body[name] = item.content;
    }  // other fields are ignored, as OpenAI ignores them (and /v1/images/generations too)
  }
  return body;
}

}  // namespace cubevec::server
