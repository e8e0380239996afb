// The HTTP front end of `cubevec serve`: cpp-httplib with the server's limits (body size, read and
// write timeouts, a bounded pool of connection threads) and every route of routes.h.
#pragma once

#include <memory>
#include <string>

#include "server/limits.h"
#include "server/scheduler.h"

namespace httplib {
class Server;
}

namespace cubevec::server {

struct ServerContext;

class HttpServer {
 public:
  HttpServer(Scheduler& scheduler, const ServeLimits& limits);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds `host`:`port` (port 0: a free one); returns the port. An Error names the address.
  int bind(const std::string& host, int port);
  // Serves until stop(), on the calling thread.
  void run();
  // Stops accepting connections and ends run(); connections in progress finish.
  void stop();

 private:
  std::unique_ptr<ServerContext> context_;
  std::unique_ptr<httplib::Server> http_;
};

// Whether `host` is a loopback address ("127.0.0.1", "::1", "localhost").
bool is_loopback(const std::string& host);

}  // namespace cubevec::server
