#include "server/api_error.h"

#include <cctype>
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
  static const std::set<std::string> keys{"prompt",         "negative_prompt",
                                          "width",          "height",
                                          "num_frames",     "num_inference_steps",
                                          "guidance_scale", "guidance_scale_2",
                                          "true_cfg_scale", "cfg",
                                          "seed",           "cache",
                                          "sparse",         "max_sequence_length",
                                          "image",          "mask_image",
                                          "last_image",     "strength",
                                          "lora",           "edit",
                                          "max_area",       "auto_resize",
                                          "quant_attention"};
  // The message may hold the client's own text (an unknown key of any length): plain scanning, no
  // regex (libstdc++'s recurses per character). First the leading word ("request: 'key' must",
  // "key: ...", "cache.cache-fn must"), then the first quoted key.
  const auto word_at = [&](std::size_t at) {
    std::size_t end = at;
    // Keys are lower case, '_' and (after the first letter: guidance_scale_2) digits.
    while (end < message.size() && (std::islower(static_cast<unsigned char>(message[end])) || message[end] == '_' ||
                                    (end > at && std::isdigit(static_cast<unsigned char>(message[end])))))
      ++end;
    return message.substr(at, end - at);
  };
  std::size_t start = message.rfind("request: ", 0) == 0 ? 9 : 0;
  if (start < message.size() && message[start] == '\'') ++start;
  if (const std::string first = word_at(start); keys.count(first)) return first;
  for (std::size_t quote = message.find('\''); quote != std::string::npos; quote = message.find('\'', quote + 1)) {
    const std::string word = word_at(quote + 1);
    if (!word.empty() && quote + 1 + word.size() < message.size() && message[quote + 1 + word.size()] == '\'' && keys.count(word))
      return word;
  }
  return "";
}

ApiError from_library_error(const std::string& message) {
  const std::string text = pipelines::in_request_terms(message);
  return invalid_request(request_key_named_in(text), text);
}

}  // namespace cubevec::server
