#include "server/http_server.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "server/api_error.h"
#include "server/http_common.h"
#include "server/routes.h"

namespace cubevec::server {

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
  http.set_keep_alive_timeout(2);  // an idle kept-alive connection holds a connection thread
  http.set_keep_alive_max_count(100);
  // Range requests would cut a JSON answer short (or send a job's id half): every answer is whole.
  // httplib parses the header before routing, so the parsed ranges are dropped here and in the
  // error handler.
  //
  // Two Content-Length headers leave the body's end ambiguous (httplib would take the first, a proxy
  // in front perhaps the last: request smuggling), so such a request is refused before its body is
  // read, and the connection closed.
  http.set_pre_routing_handler([](const httplib::Request& request, httplib::Response& response) {
    const_cast<httplib::Request&>(request).ranges.clear();
    if (const std::size_t count = request.get_header_value_count("Content-Length"); count > 1) {
      response.set_header("Connection", "close");
      send_error(response, invalid_request("",
                                           "the request has " + std::to_string(count) +
                                               " Content-Length headers; one is expected (its body's end is ambiguous)",
                                           "duplicate_content_length"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
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
