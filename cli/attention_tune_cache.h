// --attn-tune-cache FILE for any subcommand that runs attention: the autotuner's table is loaded
// before the work (a missing or stale file is a warning on stderr, a malformed one an error) and
// written back after it, so the next run skips the tuning. Without it the table lives in the
// tuning file's "attention" section, beside the GEMM calibration (one file per machine).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "device/device.h"

namespace cubevec::cli {

struct AttentionTuneCacheFlag {
  std::string path;  // empty: the tuning file's "attention" section (ops/gemm/tuner.h)
  // That section's entries for other devices, written back untouched; set when it cannot be read.
  std::shared_ptr<nlohmann::json> foreign_ = std::make_shared<nlohmann::json>(nlohmann::json::array());
  std::shared_ptr<bool> unusable_ = std::make_shared<bool>(false);

  // Both do nothing without a path.
  void load(const Device& device) const;
  void save(const Device& device) const;
};

std::shared_ptr<AttentionTuneCacheFlag> add_attention_tune_cache_flag(CLI::App& command);

}  // namespace cubevec::cli
