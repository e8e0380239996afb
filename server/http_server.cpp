#include "server/http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <string>

#include "base/json_text.h"
#include "server/api_error.h"
#include "server/http_common.h"
#include "server/routes.h"

namespace cubevec::server {

namespace {

// Why the request's body has no one clear end, or "": several Content-Length headers, a value that
// is not one number, a Transfer-Encoding beside a Content-Length, or one that is not "chunked".
std::string ambiguous_framing(const httplib::Request& request) {
  const std::size_t lengths = request.get_header_value_count("Content-Length");
  if (lengths > 1)
    return "the request has " + std::to_string(lengths) + " Content-Length headers; one is expected (its body's end is ambiguous)";
  const std::string length = request.get_header_value("Content-Length");
  if (lengths == 1 && (length.empty() || length.size() > 18 || length.find_first_not_of("0123456789") != std::string::npos))
    return "the request's Content-Length is not one decimal number, got '" + utf8_or_escaped(length.substr(0, 40)) + "'";
  const std::size_t encodings = request.get_header_value_count("Transfer-Encoding");
  if (encodings > 0 && lengths > 0) return "the request has both Content-Length and Transfer-Encoding; one framing is expected";
  if (encodings > 1) return "the request has " + std::to_string(encodings) + " Transfer-Encoding headers; one is expected";
  if (encodings == 1) {
    std::string encoding = request.get_header_value("Transfer-Encoding");
    std::transform(encoding.begin(), encoding.end(), encoding.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (encoding != "chunked")
      return "the request's Transfer-Encoding is '" + utf8_or_escaped(encoding.substr(0, 40)) + "'; this server takes chunked only";
  }
  return "";
}

}  // namespace

HttpServer::HttpServer(Scheduler& scheduler, const ServeLimits& limits)
    : context_(std::make_unique<ServerContext>(scheduler, limits)), http_(std::make_unique<httplib::Server>()) {
  httplib::Server& http = *http_;
  const int threads = limits.http_threads;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<std::size_t>(threads)); };
  http.set_payload_max_length(limits.max_body_bytes);
  http.set_read_timeout(limits.read_timeout_s, 0);
  http.set_write_timeout(limits.write_timeout_s, 0);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second server on a port in
  // use would bind too and silently share its connections.
  http.set_socket_options([](int socket) {
    const int yes = 1;
    ::setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // One request per connection: httplib cannot close a kept-alive connection from a handler, so a
  // request refused for its framing (below) could leave its body to be read as the next request
  // (request smuggling). A generation server's requests are few and long; reconnecting costs
  // nothing that matters.
  http.set_keep_alive_timeout(2);
  http.set_keep_alive_max_count(1);
  // Range requests would cut a JSON answer short (or send a job's id half): every answer is whole.
  // httplib parses the header before routing, so the parsed ranges are dropped here and in the
  // error handler.
  //
  // A body whose end is ambiguous (httplib would read it one way, a proxy in front perhaps another:
  // request smuggling) is refused before it is read, and the connection closed (one request per
  // connection).
  http.set_pre_routing_handler([](const httplib::Request& request, httplib::Response& response) {
    const_cast<httplib::Request&>(request).ranges.clear();
    const std::string framing = ambiguous_framing(request);
    if (framing.empty()) return httplib::Server::HandlerResponse::Unhandled;
    response.set_header("Connection", "close");
    send_error(response, invalid_request("", framing, "ambiguous_framing"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors httplib answers itself (no such route, a body over --max-body, a malformed request)
  // get the same JSON error object as the routes'.
  http.set_error_handler([limits, context = context_.get()](const httplib::Request& request, httplib::Response& response) {
    const_cast<httplib::Request&>(request).ranges.clear();
    if (!response.body.empty()) return;
    ApiError error(response.status, "invalid_request_error", "http_error", "", "HTTP error " + std::to_string(response.status));
    // A known path asked with another method: 405 with the methods it takes.
    const std::string allowed = response.status == 404 && request.path.size() <= 1024 ? allowed_methods(*context, request.path) : "";
    if (!allowed.empty()) {
      response.set_header("Allow", allowed);
      error = ApiError(405, "invalid_request_error", "method_not_allowed", "",
                       request.path.substr(0, 200) + " takes " + allowed + ", not " + request.method.substr(0, 20));
    } else if (response.status == 404) {
      error = not_found("no route " + request.method + " " + request.path.substr(0, 200) + " on this server");
    } else if (response.status == 413)
      error = ApiError(413, "invalid_request_error", "body_too_large", "",
                       "the request body is larger than this server's --max-body of " + std::to_string(limits.max_body_bytes) + " bytes");
    else if (response.status == 400) error = invalid_request("", "the HTTP request is malformed", "bad_http_request");
    else if (response.status == 416)
      error = invalid_request("", "this server sends whole answers and takes no Range header", "range_not_supported");
    else if (response.status == 405)
      error = ApiError(405, "invalid_request_error", "method_not_allowed", "",
                       "the method " + request.method + " is not allowed on " + request.path.substr(0, 200));
    send_error(response, error);
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& response, std::exception_ptr) {
    send_error(response, ApiError(500, "server_error", "internal_error", "", "internal error while answering the request"));
  });
  add_openai_image_routes(http, *context_);
  add_video_routes(http, *context_);
  add_a1111_routes(http, *context_);
  add_job_routes(http, *context_);
  add_web_page_route(http, *context_);
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::bind(const std::string& host, int port) {
  if (port < 0 || port > 65535) throw Error("--port must be in 0..65535, got " + std::to_string(port));
  errno = 0;
  const int bound = port == 0 ? http_->bind_to_any_port(host) : (http_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0)
    throw Error("cannot listen on " + host + ":" + std::to_string(port) +
                (errno ? std::string(": ") + std::strerror(errno) : std::string()) +
                " (a host name or address this machine has, and a free port)");
  return bound;
}

void HttpServer::run() { http_->listen_after_bind(); }

void HttpServer::stop() {
  if (http_->is_running()) http_->stop();
}

bool is_loopback(const std::string& host) { return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0; }

}  // namespace cubevec::server
