// OpenAI's images API: POST /v1/images/generations, POST /v1/images/edits (a multipart form with the
// picture and an optional mask: image-to-image or inpainting), GET /v1/models, and the files that
// response_format "url" points at.
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "media/png.h"
#include "server/request_body.h"
#include "server/routes.h"

namespace cubevec::server {

namespace {

std::string mime_of(const std::string& format) { return format == "png" ? "image/png" : "image/jpeg"; }

void generate_images(ServerContext& context, const httplib::Request& http_request, httplib::Response& response, const nlohmann::json& body,
                     const Uploads& uploads) {
  const std::optional<std::string> prompt = string_field(body, "prompt");
  if (!prompt || prompt->empty()) throw invalid_request("prompt", "'prompt' is required: a non-empty string", "missing_required_parameter");
  const std::string model_name = string_field(body, "model", {}, 256).value_or("");
  const int n = static_cast<int>(integer_field(body, "n", 1, context.limits.max_n).value_or(1));
  const auto size = size_field(body, "size", context.limits.max_side);
  const std::string response_format = string_field(body, "response_format", {"b64_json", "url"}).value_or("b64_json");
  std::string output_format = string_field(body, "output_format", {"png", "jpeg", "jpg", "webp"}).value_or("png");
  if (output_format == "webp") throw invalid_request("output_format", "'output_format' webp is not supported here; use png or jpeg");
  if (output_format == "jpg") output_format = "jpeg";
  const int quality = static_cast<int>(integer_field(body, "output_compression", 0, 100).value_or(92));

  const ServedModel& model = context.scheduler.model(model_name);
  nlohmann::json keys = {{"prompt", *prompt}};
  copy_diffusion_keys(body, keys);
  if (size) keys["width"] = size->first, keys["height"] = size->second;
  if (!keys.contains("seed")) keys["seed"] = random_seed();
  const pipelines::Request first = checked_request(keys, model, context.limits, /*video_route=*/false, uploads);
  if (first.seed > UINT64_MAX - static_cast<uint64_t>(n - 1))
    throw invalid_request(
        "seed", "'seed' + n - 1 must stay at most " + std::to_string(UINT64_MAX) + " (the pictures' seeds are seed, seed + 1, ...)");
  // n pictures: seeds seed, seed + 1, ... (as diffusers' generator list would be seeded).
  std::vector<pipelines::Request> requests(static_cast<std::size_t>(n), first);
  for (int i = 0; i < n; ++i) requests[static_cast<std::size_t>(i)].seed = first.seed + static_cast<uint64_t>(i);
  const std::vector<std::shared_ptr<Job>> jobs = context.scheduler.submit(model.name, requests, "openai");
  wait_all(jobs);

  nlohmann::ordered_json data = nlohmann::ordered_json::array();
  for (const auto& job : jobs) {
    nlohmann::ordered_json item;
    if (response_format == "url") {
      item["url"] = base_url(http_request) + "/v1/images/files/" + job->id() + "." + (output_format == "png" ? "png" : "jpg");
    } else {
      const auto images = job->images();
      item["b64_json"] = base64(encoded_image(images->at(0), output_format, quality, job->id()));
    }
    item["seed"] = job->request().seed;
    data.push_back(item);
  }
  nlohmann::ordered_json answer{{"created", unix_seconds()}, {"data", data}, {"output_format", output_format}};
  answer["size"] = std::to_string(*first.width) + "x" + std::to_string(*first.height);
  answer["model"] = model.name;
  send_json(response, 200, answer);
}

// POST /v1/images/edits: `image` (one picture) and optionally `mask`, as OpenAI's API sends them. The
// mask's fully transparent pixels are repainted (OpenAI's rule); a mask without alpha is read as the
// command line reads one, white repainted. Both must have one size.
void edit_images(ServerContext& context, const httplib::Request& http_request, httplib::Response& response) {
  if (!http_request.is_multipart_form_data())
    throw invalid_request("image", "POST /v1/images/edits takes a multipart form: the 'image' file, 'prompt', and optionally 'mask'");
  const nlohmann::json body = form_fields(http_request, {"image", "image[]", "mask"});
  const std::size_t pictures = http_request.files.count("image") + http_request.files.count("image[]");
  if (pictures == 0)
    throw invalid_request("image", "'image' is required: the picture to edit (a PNG or JPEG file)", "missing_required_parameter");
  if (pictures > 1) throw invalid_request("image", "one 'image' per request: this server edits one picture");
  const std::string picture_field = http_request.has_file("image") ? "image" : "image[]";
  Uploads uploads;
  uploads.image = decode_upload(http_request.get_file_value(picture_field).content, "image");
  if (http_request.files.count("mask") > 1) throw invalid_request("mask", "one 'mask' per request");
  if (http_request.has_file("mask")) {
    std::vector<uint8_t> alpha;
    auto mask = std::make_shared<media::RgbImage>(*decode_upload(http_request.get_file_value("mask").content, "mask", &alpha));
    if (mask->width != uploads.image->width || mask->height != uploads.image->height)
      throw invalid_request("mask", "the mask is " + std::to_string(mask->width) + "x" + std::to_string(mask->height) + " and the image " +
                                        std::to_string(uploads.image->width) + "x" + std::to_string(uploads.image->height) +
                                        "; they must have one size");
    if (!alpha.empty())
      for (std::size_t i = 0; i < alpha.size(); ++i)
        std::fill_n(mask->pixels.begin() + static_cast<std::ptrdiff_t>(3 * i), 3, alpha[i] == 0 ? 255 : 0);
    uploads.mask = std::move(mask);
  }
  generate_images(context, http_request, response, body, uploads);
}

void serve_image_file(ServerContext& context, const httplib::Request& http_request, httplib::Response& response) {
  const std::string id = http_request.matches[1], extension = http_request.matches[2];
  const std::shared_ptr<Job> job = context.scheduler.find(id);
  if (!job || job->video()) throw not_found("no picture '" + id + "' on this server (pictures are kept for the last jobs only)");
  const JobSnapshot s = job->snapshot();
  if (s.status != JobStatus::completed)
    throw ApiError(409, "invalid_request_error", "not_ready", "", "the picture '" + id + "' is " + status_name(s.status));
  const std::string format = extension == "png" ? "png" : "jpeg";
  const auto images = job->images();
  response.status = 200;
  response.set_content(encoded_image(images->at(0), format, 92, id), mime_of(format));
}

void list_models(ServerContext& context, httplib::Response& response) {
  nlohmann::ordered_json data = nlohmann::ordered_json::array();
  for (const ServedModel* model : context.scheduler.models())
    data.push_back({{"id", model->name},
                    {"object", "model"},
                    {"created", unix_seconds()},
                    {"owned_by", "cubevec"},
                    {"family", model->pipeline->model().family()},
                    {"task", model->pipeline->model().task()},
                    {"instances", context.scheduler.options().instances}});
  send_json(response, 200, {{"object", "list"}, {"data", data}});
}

}  // namespace

std::string encoded_image(const media::RgbImage& image, const std::string& format, int jpeg_quality, const std::string& what) {
  const std::vector<uint8_t> bytes =
      format == "png" ? media::encode_png(image, what) : media::encode_jpeg(image, std::max(1, jpeg_quality), what);
  return std::string(bytes.begin(), bytes.end());
}

std::string base64(const std::string& bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8 | uint8_t(bytes[i + 2]);
    for (int shift = 18; shift >= 0; shift -= 6) out += kAlphabet[(v >> shift) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

void add_openai_image_routes(httplib::Server& http, ServerContext& context) {
  add_route(http, context, "POST", "/v1/images/generations", answering_errors([&](const httplib::Request& q, httplib::Response& r) {
              generate_images(context, q, r, parse_body(q.body, q.get_header_value("Content-Type")), {});
            }));
  add_route(http, context, "POST", "/v1/images/edits",
            answering_errors([&](const httplib::Request& q, httplib::Response& r) { edit_images(context, q, r); }));
  add_route(http, context, "GET", R"(/v1/images/files/([A-Za-z0-9_]+)\.(png|jpg))",
            answering_errors([&](const httplib::Request& q, httplib::Response& r) { serve_image_file(context, q, r); }));
  add_route(http, context, "GET", "/v1/models",
            answering_errors([&](const httplib::Request&, httplib::Response& r) { list_models(context, r); }));
}

}  // namespace cubevec::server
