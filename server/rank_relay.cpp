#include "server/rank_relay.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "parallel/mpi_runtime.h"
#include "base/json_text.h"

namespace cubevec::server {

void RankRelay::send(const nlohmann::json& command) const {
  const std::string text = dump_json(command);
  // The length first (8 bytes from rank 0, none from the others), then the text.
  std::vector<std::size_t> sizes(static_cast<std::size_t>(world_.size()), 0);
  sizes[0] = sizeof(uint64_t);
  const uint64_t length = text.size();
  uint64_t gathered = 0;
  world_.all_gather(&length, &gathered, sizes, "serve: the next command's length");
  sizes[0] = text.size();
  std::string out(text.size(), '\0');
  world_.all_gather(text.data(), out.data(), sizes, "serve: the next command");
}

nlohmann::json RankRelay::receive() const {
  std::vector<std::size_t> sizes(static_cast<std::size_t>(world_.size()), 0);
  sizes[0] = sizeof(uint64_t);
  uint64_t length = 0;
  world_.all_gather(nullptr, &length, sizes, "serve: the next command's length");
  if (length > (uint64_t{64} << 20)) throw Error("serve: rank 0 sent a command of " + std::to_string(length) + " bytes");
  sizes[0] = static_cast<std::size_t>(length);
  std::string text(static_cast<std::size_t>(length), '\0');
  world_.all_gather(nullptr, text.data(), sizes, "serve: the next command");
  return nlohmann::json::parse(text);
}

double RankRelay::idle_interval_s() const { return std::clamp(parallel::collective_timeout() / 4, 0.5, 5.0); }

int follow_rank_zero(const pipelines::Pipeline& pipeline, const RankRelay& relay) {
  Device device(pipeline.profile(), DeviceOptions{});
  try {
    for (;;) {
      const nlohmann::json command = relay.receive();
      const std::string op = command.at("op");
      if (op == "stop") return 0;
      if (op != "generate") continue;  // "idle", "finished"
      pipelines::GenerateHooks hooks;
      hooks.device = &device;
      pipeline.generate(pipelines::Request::from_json(command.at("request")), hooks);
    }
  } catch (const std::exception& e) {
    // Rank 0 checked the request and encoded its prompt before sending it: what fails here is this
    // rank's own, and rank 0 must hear of it rather than wait in a collective.
    const std::string message = std::string("serve: ") + e.what();
    std::fprintf(stderr, "error: rank %d: %s\n", relay.rank(), message.c_str());
    parallel::announce_failure(message);
    return 1;
  }
}

}  // namespace cubevec::server
