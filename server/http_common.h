// What every route file shares: the server's state, JSON and error responses, and the conversion
// of a route's fields into the library's request with the server's limits.
#pragma once

#include <httplib.h>

#include <atomic>
#include <functional>
#include <regex>
#include <utility>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "media/jpeg.h"

#include "pipelines/request.h"
#include "server/api_error.h"
#include "server/limits.h"
#include "server/scheduler.h"

namespace cubevec::server {

struct ServerContext {
  ServerContext(Scheduler& s, const ServeLimits& l) : scheduler(s), limits(l) {}
  Scheduler& scheduler;
  ServeLimits limits;
  // Event streams open now: each holds a connection thread for its job's life, so at most half the
  // threads may be streams and the rest stay free for other requests.
  std::atomic<int> event_streams{0};
  // Every route's method and pattern, so a known path asked with another method is a 405.
  std::vector<std::pair<std::string, std::regex>> routes;
};

void send_json(httplib::Response& response, int status, const nlohmann::ordered_json& body);
void send_error(httplib::Response& response, const ApiError& error);

// A handler whose ApiError, cubevec::Error and other exceptions become the error response.
using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
Handler answering_errors(Handler handler);

// Registers `handler` for `method` ("GET", "POST", "DELETE") and `pattern`, and records both.
void add_route(httplib::Server& http, ServerContext& context, const std::string& method, const std::string& pattern, Handler handler);
// The methods the routes take for `path` ("GET, DELETE"), or "" for an unknown path.
std::string allowed_methods(const ServerContext& context, const std::string& path);

// The keys of the library's request a generating route passes through as they are (the diffusion
// settings OpenAI's API does not have): negative_prompt, num_inference_steps, guidance_scale,
// true_cfg_scale, seed, cfg, cache, sparse, max_sequence_length, num_frames.
void copy_diffusion_keys(const nlohmann::json& body, nlohmann::json& request_keys);
// Throws the 400 for a key that names a file (prompt_embeds, image, mask_image): the server reads
// no file a client names.
void refuse_file_keys(const nlohmann::json& body);
// A request's "lora" names (NAME or NAME:SCALE) as files of `lora_dir` (NAME a plain file name there,
// not a link): an invalid_request naming 'lora' for anything else, or for any name without a folder.
std::vector<std::string> served_lora_files(const std::vector<std::string>& names, const std::string& lora_dir);

// Pictures a route received as uploads (decoded, checked): they go into the request in memory,
// never as files.
struct Uploads {
  std::shared_ptr<const media::RgbImage> image, mask, last_image;
};

// A multipart form's text fields as the JSON body the route's JSON form takes: the numeric fields
// parsed as numbers, edit / auto_resize as booleans, the rest as strings, unknown fields ignored (as
// OpenAI ignores them). `file_fields` must be files (each checked by the route); a file where text
// belongs, text where a file belongs, or a text field twice is a 400 naming it.
nlohmann::json form_fields(const httplib::Request& http_request, const std::set<std::string>& file_fields);

// `request_keys` (the library's request JSON) as a Request for `model`, with the model's defaults,
// checked against the model and the server's limits; every error a 400 naming the field.
// `video_route`: whether the route makes videos (a model of the other kind is a 400).
pipelines::Request checked_request(const nlohmann::json& request_keys, const ServedModel& model, const ServeLimits& limits,
                                   bool video_route, const Uploads& uploads = {});

// An uploaded picture (PNG or JPEG bytes) decoded as the command line reads a file; anything else a
// 400 naming `param`. With `alpha`, a PNG's alpha channel too (media/image_input.h).
std::shared_ptr<const media::RgbImage> decode_upload(const std::string& bytes, const std::string& param,
                                                     std::vector<uint8_t>* alpha = nullptr);

// The seed a route uses when the client gives none (OpenAI and AUTOMATIC1111's -1): random.
uint64_t random_seed();

// Waits for every job (they end: the scheduler's timeout bounds them); the first failure or
// cancellation as the ApiError to answer with.
void wait_all(const std::vector<std::shared_ptr<Job>>& jobs);

// The base URL a client reached this server at ("http://127.0.0.1:8080"), for response URLs.
std::string base_url(const httplib::Request& request);

}  // namespace cubevec::server
