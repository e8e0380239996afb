// A server for the API tests: the tiny models loaded in this process, cubevec serve's scheduler and
// HTTP front end on an ephemeral loopback port, and a client for it.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "media/png.h"
#include "server/http_server.h"
#include "server/scheduler.h"
#include "tokenizers/t5_tokenizer_json.h"

namespace cubevec_server_test {

inline const std::string kTinyFlux = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";
inline const std::string kTinyWan = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinywan";
inline const std::string kPrompt = "a large red circle in the center on a blue background";

class TestServer {
 public:
  explicit TestServer(cubevec::server::SchedulerOptions options = {}, cubevec::server::ServeLimits limits = {}, bool with_wan = false) {
    std::vector<cubevec::server::ServedModel> models;
    models.push_back({"tinyflux", kTinyFlux, cubevec::pipelines::Pipeline::load(kTinyFlux)});
    if (with_wan) models.push_back({"tinywan", kTinyWan, cubevec::pipelines::Pipeline::load(kTinyWan)});
    start(std::move(models), options, limits);
  }
  // The named model folders instead of the tiny models.
  TestServer(const std::vector<std::pair<std::string, std::string>>& folders, cubevec::server::SchedulerOptions options = {},
             cubevec::server::ServeLimits limits = {}) {
    std::vector<cubevec::server::ServedModel> models;
    for (const auto& [name, dir] : folders) models.push_back({name, dir, cubevec::pipelines::Pipeline::load(dir)});
    start(std::move(models), options, limits);
  }
  ~TestServer() {
    http_->stop();
    thread_.join();
    http_.reset();
    scheduler_.reset();
  }

  int port() const { return port_; }
  cubevec::server::Scheduler& scheduler() { return *scheduler_; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const std::string& body) const {
    return client().Post(path.c_str(), body, "application/json");
  }
  httplib::Result get(const std::string& path) const { return client().Get(path.c_str()); }
  httplib::Result del(const std::string& path) const { return client().Delete(path.c_str()); }

 private:
  void start(std::vector<cubevec::server::ServedModel> models, const cubevec::server::SchedulerOptions& options,
             const cubevec::server::ServeLimits& limits) {
    scheduler_ = std::make_unique<cubevec::server::Scheduler>(std::move(models), options);
    http_ = std::make_unique<cubevec::server::HttpServer>(*scheduler_, limits);
    port_ = http_->bind("127.0.0.1", 0);
    thread_ = std::thread([this] { http_->run(); });
  }

  std::unique_ptr<cubevec::server::Scheduler> scheduler_;
  std::unique_ptr<cubevec::server::HttpServer> http_;
  int port_ = 0;
  std::thread thread_;
};

inline nlohmann::json json_of(const httplib::Result& result) {
  if (!result) return nlohmann::json{{"transport_error", httplib::to_string(result.error())}};
  return nlohmann::json::parse(result->body, nullptr, /*allow_exceptions=*/false);
}

// The server's base64 read back by the tokenizers' decoder (RFC 4648), written apart from it.
inline std::string from_base64(const std::string& text) { return cubevec::tokenizers::decode_base64(text); }

inline cubevec::media::RgbImage png_of(const std::string& bytes) {
  return cubevec::media::decode_png(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "response");
}

}  // namespace cubevec_server_test
