// The server's one error type: what every route answers when a request cannot be served, as
// OpenAI's error object {"error": {"message", "type", "param", "code"}} with an HTTP status.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"

namespace cubevec::server {

class ApiError : public Error {
 public:
  // `param`: the request field at fault ("" when none); `code`: a short machine-readable reason.
  ApiError(int status, std::string type, std::string code, std::string param, const std::string& message)
      : Error(message), status_(status), type_(std::move(type)), code_(std::move(code)), param_(std::move(param)) {}

  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& code() const { return code_; }
  const std::string& param() const { return param_; }
  nlohmann::ordered_json to_json() const;

 private:
  int status_;
  std::string type_, code_, param_;
};

// The common ones. invalid_request: 400, naming the field.
ApiError invalid_request(const std::string& param, const std::string& message, const std::string& code = "invalid_value");
ApiError not_found(const std::string& what, const std::string& code = "not_found");  // 404
ApiError queue_full(const std::string& model, int queued, int limit);                // 429
ApiError unavailable(const std::string& message);                                    // 503 (shutting down)

// A library error (its message names a flag or a request key) as the 400 it is, with the request
// key it names as `param` when there is one.
ApiError from_library_error(const std::string& message);
// The request key a library message is about ("" when it names none).
std::string request_key_named_in(const std::string& message);

}  // namespace cubevec::server
