// What one HTTP request may ask of the server (the `cubevec serve` flags of the same names).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cubevec::server {

struct ServeLimits {
  std::size_t max_body_bytes = std::size_t{32} << 20;  // --max-body: room for a picture upload
  int read_timeout_s = 10, write_timeout_s = 10;       // --read-timeout, --write-timeout: a stalled client is dropped
  int http_threads = 64;                               // --http-threads: connections served at once
  int max_n = 4;                                       // --max-n: pictures per request
  int64_t max_side = 2048;                             // --max-size: width and height
  int max_steps = 200;                                 // --max-steps
  int64_t max_frames = 129;                            // --max-frames
  // --lora-dir: the folder a request's "lora" names files in (empty: requests may not name LoRAs).
  std::string lora_dir;
};

}  // namespace cubevec::server
