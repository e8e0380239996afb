// The server's routes, one file per API; each adds its handlers to the HTTP server.
#pragma once

#include "server/http_common.h"

namespace cubevec::server {

void add_openai_image_routes(httplib::Server& http, ServerContext& context);  // /v1/images/..., /v1/models
void add_video_routes(httplib::Server& http, ServerContext& context);         // /v1/videos...
void add_a1111_routes(httplib::Server& http, ServerContext& context);         // /sdapi/v1/...
void add_job_routes(httplib::Server& http, ServerContext& context);           // /v1/jobs..., /health, /metrics
void add_web_page_route(httplib::Server& http, ServerContext& context);       // /

// Encodes a finished job's picture for a response.
std::string encoded_image(const media::RgbImage& image, const std::string& format, int jpeg_quality, const std::string& what);
std::string base64(const std::string& bytes);

}  // namespace cubevec::server
