// The step caches' settings, from the command line or a JSON file with the same keys as the flags
// (without the dashes), validated against the run (steps, blocks) with errors that name the key
// and the allowed range.
//
//   attention, dit-block: MindIE SD's CacheConfig (docs/stages.md, "MindIE SD's CacheConfig"):
//     cache-step-start, cache-interval, cache-step-end, cache-block-start, cache-block-end;
//   db: cache-dit's DBCache (FBCache is F1B0; docs/stages.md, "cache-dit's DBCache and TaylorSeer"):
//     cache-fn, cache-bn, cache-threshold, cache-warmup, cache-max-cached, cache-max-continuous,
//     and taylorseer (order 1 or 2; 0 off).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "pipelines/stage.h"

namespace cubevec::pipelines {

enum class CacheMethod { none, attention, dit_block, db };
CacheMethod parse_cache_method(std::string_view name);  // "none", "attention", "dit-block", "db"
std::string_view cache_method_name(CacheMethod method);

struct CacheConfig {
  CacheMethod method = CacheMethod::none;
  // MindIE SD (attention, dit-block). Unset ends mean "to the last step / block".
  int step_start = 0, step_interval = 1;
  std::optional<int> step_end, block_end;
  int block_start = 0;
  // cache-dit (db), with its defaults.
  int fn = 8, bn = 0;
  double threshold = 0.08;
  int warmup = 8;
  int max_cached = -1, max_continuous = -1;  // -1: no limit
  int taylorseer = 0;                        // Taylor order 1 or 2, 0 off

  // The keys a JSON config may hold (the flags' names without "--").
  static CacheConfig from_json(const nlohmann::json& json, const std::string& source);
  static CacheConfig load(const std::string& path);
  nlohmann::ordered_json to_json() const;  // the keys that apply to `method`
  std::string describe() const;            // "dit-block: blocks [1, 4) from step 5, every 2", ...

  // Errors (naming the key and the allowed range) for values that can never apply to a run of
  // `steps` steps over `blocks` blocks, with the MindIE CacheAgent's checks for its methods.
  void validate(int steps, int blocks) const;
  // MindIE's bypass: settings under which its CacheAgent calls the function directly (the cache
  // never applies); the reason, or nothing.
  std::optional<std::string> bypass_reason(int steps, int blocks) const;
};

// The cache stage for `config` (null for method none), validated against the run.
std::unique_ptr<Stage> make_cache_stage(const CacheConfig& config, int steps, int blocks);

}  // namespace cubevec::pipelines
