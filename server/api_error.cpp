#include "server/api_error.h"

#include <regex>
#include <set>

#include "pipelines/request.h"

namespace cubevec::server {

nlohmann::ordered_json ApiError::to_json() const {
  nlohmann::ordered_json error{{"message", what()}, {"type", type_}};
  error["param"] = param_.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param_);
  error["code"] = code_;
  return {{"error", error}};
}

ApiError invalid_request(const std::string& param, const std::string& message, const std::string& code) {
  return ApiError(400, "invalid_request_error", code, param, message);
}

ApiError not_found(const std::string& what, const std::string& code) { return ApiError(404, "invalid_request_error", code, "", what); }

ApiError queue_full(const std::string& model, int queued, int limit) {
  return ApiError(429, "rate_limit_error", "queue_full", "",
                  "the queue of model '" + model + "' is full (" + std::to_string(queued) + " of --max-queue " + std::to_string(limit) +
                      " requests waiting); retry later");
}

ApiError unavailable(const std::string& message) { return ApiError(503, "server_error", "unavailable", "", message); }

std::string request_key_named_in(const std::string& message) {
  static const std::set<std::string> keys{"prompt",
                                          "negative_prompt",
                                          "width",
                                          "height",
                                          "num_frames",
                                          "num_inference_steps",
                                          "guidance_scale",
                                          "true_cfg_scale",
                                          "cfg",
                                          "seed",
                                          "cache",
                                          "sparse",
                                          "max_sequence_length"};
  // "request: 'key' must ...", "key: ...", "key must ...", "cache.cache-fn must ...": the first word;
  // else the first quoted key.
  static const std::regex leading("^(?:request: )?'?([a-z_]+)'?[ :.]");
  static const std::regex quoted("'([a-z_]+)'");
  std::smatch match;
  if (std::regex_search(message, match, leading) && keys.count(match[1])) return match[1];
  for (auto it = std::sregex_iterator(message.begin(), message.end(), quoted); it != std::sregex_iterator(); ++it)
    if (keys.count((*it)[1])) return (*it)[1];
  return "";
}

ApiError from_library_error(const std::string& message) {
  const std::string text = pipelines::in_request_terms(message);
  return invalid_request(request_key_named_in(text), text);
}

}  // namespace cubevec::server
