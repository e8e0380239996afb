// --attn-tune-cache FILE for any subcommand that runs attention: the autotuner's table is loaded
// before the work (a missing or stale file is a warning on stderr, a malformed one an error) and
// written back after it, so the next run skips the tuning.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "device/device.h"

namespace cubevec::cli {

struct AttentionTuneCacheFlag {
  std::string path;  // empty: tune in memory only

  // Both do nothing without a path.
  void load(const Device& device) const;
  void save(const Device& device) const;
};

std::shared_ptr<AttentionTuneCacheFlag> add_attention_tune_cache_flag(CLI::App& command);

}  // namespace cubevec::cli
