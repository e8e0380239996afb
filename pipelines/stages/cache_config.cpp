#include "pipelines/stages/cache_config.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "pipelines/stages/attention_cache.h"
#include "pipelines/stages/db_cache.h"
#include "pipelines/stages/dit_block_cache.h"
#include "base/config_reader.h"
#include "base/enum_names.h"
#include "base/strict_json.h"

namespace cubevec::pipelines {

namespace {

constexpr auto kMethodNames = enum_names<CacheMethod>(
    "cache method",
    {{CacheMethod::none, "none"}, {CacheMethod::attention, "attention"}, {CacheMethod::dit_block, "dit-block"}, {CacheMethod::db, "db"}});

const std::vector<std::string> kMindieKeys = {"cache-step-start", "cache-interval", "cache-step-end", "cache-block-start",
                                              "cache-block-end"};
const std::vector<std::string> kDbKeys = {
    "cache-fn", "cache-bn", "cache-threshold", "cache-warmup", "cache-max-cached", "cache-max-continuous", "taylorseer"};

[[noreturn]] void fail(const std::string& key, const std::string& message) { throw Error("--" + key + " " + message); }

}  // namespace

CacheMethod parse_cache_method(std::string_view name) { return kMethodNames.parse(name); }
std::string_view cache_method_name(CacheMethod method) { return kMethodNames.name(method); }

CacheConfig CacheConfig::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "cache config");
  CacheConfig c;
  std::string method = "none";
  r.require({"cache"});
  r.text("cache", method);
  try {
    c.method = parse_cache_method(method);
  } catch (const Error& e) {
    r.fail("cache", "must be one of none, attention, dit-block, db, got \"" + method + "\"");
  }
  const int64_t big = int64_t{1} << 30;
  int step_end = -1, block_end = -1;
  r.integer("cache-step-start", c.step_start, 0, big)
      .integer("cache-interval", c.step_interval, 1, big)
      .integer("cache-step-end", step_end, 0, big)
      .integer("cache-block-start", c.block_start, 0, big)
      .integer("cache-block-end", block_end, 0, big)
      .integer("cache-fn", c.fn, 1, big)
      .integer("cache-bn", c.bn, 0, big)
      .number_in("cache-threshold", c.threshold, 0.0, 1e6)
      .integer("cache-warmup", c.warmup, 0, big)
      .integer("cache-max-cached", c.max_cached, -1, big)
      .integer("cache-max-continuous", c.max_continuous, -1, big)
      .integer("taylorseer", c.taylorseer, 0, 2);
  r.reject_unknown();
  if (r.has("cache-step-end")) c.step_end = step_end;
  if (r.has("cache-block-end")) c.block_end = block_end;
  const bool mindie = c.method == CacheMethod::attention || c.method == CacheMethod::dit_block;
  for (const std::string& key : kMindieKeys)
    if (r.has(key) && !mindie) r.fail(key, "does not apply to \"cache\": \"" + method + "\" (it applies to attention and dit-block)");
  for (const std::string& key : kDbKeys)
    if (r.has(key) && c.method != CacheMethod::db) r.fail(key, "does not apply to \"cache\": \"" + method + "\" (it applies to db)");
  return c;
}

CacheConfig CacheConfig::load(const std::string& path) { return from_json(read_json_file(path), path); }

nlohmann::ordered_json CacheConfig::to_json() const {
  nlohmann::ordered_json j{{"cache", cache_method_name(method)}};
  if (method == CacheMethod::attention || method == CacheMethod::dit_block) {
    j["cache-step-start"] = step_start;
    j["cache-interval"] = step_interval;
    if (step_end) j["cache-step-end"] = *step_end;
    j["cache-block-start"] = block_start;
    if (block_end) j["cache-block-end"] = *block_end;
  } else if (method == CacheMethod::db) {
    j["cache-fn"] = fn;
    j["cache-bn"] = bn;
    j["cache-threshold"] = threshold;
    j["cache-warmup"] = warmup;
    j["cache-max-cached"] = max_cached;
    j["cache-max-continuous"] = max_continuous;
    j["taylorseer"] = taylorseer;
  }
  return j;
}

std::string CacheConfig::describe() const {
  const auto end = [](const std::optional<int>& v) { return v ? std::to_string(*v) : std::string("end"); };
  char text[160];
  switch (method) {
    case CacheMethod::none: return "none";
    case CacheMethod::attention:
      return "attention: steps " + std::to_string(step_start) + ".." + end(step_end) + ", every " + std::to_string(step_interval);
    case CacheMethod::dit_block:
      return "dit-block: blocks [" + std::to_string(block_start) + ", " + end(block_end) + ") from step " + std::to_string(step_start) +
             ", every " + std::to_string(step_interval);
    case CacheMethod::db:
      std::snprintf(text, sizeof text, "db: F%dB%d, threshold %g, warm-up %d%s", fn, bn, threshold, warmup,
                    taylorseer ? (", TaylorSeer " + std::to_string(taylorseer)).c_str() : "");
      return text;
  }
  return "?";
}

void CacheConfig::validate(int steps, int blocks) const {
  const auto range = [](int lo, int hi) { return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]"; };
  switch (method) {
    case CacheMethod::none: return;
    case CacheMethod::attention:
    case CacheMethod::dit_block: {
      // MindIE SD's CacheAgent checks, then the ones a CLI can state against the run.
      if (step_start < 0) fail("cache-step-start", "must be >= 0, got " + std::to_string(step_start));
      if (step_interval <= 0) fail("cache-interval", "must be > 0, got " + std::to_string(step_interval));
      if (block_start < 0) fail("cache-block-start", "must be >= 0, got " + std::to_string(block_start));
      if (step_end && *step_end < step_start)
        fail("cache-step-end", "must be >= --cache-step-start " + std::to_string(step_start) + ", got " + std::to_string(*step_end));
      if (block_end && *block_end < block_start)
        fail("cache-block-end", "must be >= --cache-block-start " + std::to_string(block_start) + ", got " + std::to_string(*block_end));
      if (method == CacheMethod::dit_block && block_end && *block_end > blocks)
        fail("cache-block-end", "must be in " + range(block_start, blocks) + " (this model has " + std::to_string(blocks) +
                                    " blocks; the span is [start, end)), got " + std::to_string(*block_end));
      return;
    }
    case CacheMethod::db: {
      if (fn < 1 || fn > blocks)
        fail("cache-fn", "must be in " + range(1, blocks) + " (blocks computed first; the default is 8), got " + std::to_string(fn));
      if (bn < 0 || fn + bn >= blocks)
        fail("cache-bn", "must be in " + range(0, std::max(0, blocks - fn - 1)) + " so that --cache-fn " + std::to_string(fn) +
                             " + --cache-bn leaves blocks to cache in a " + std::to_string(blocks) + "-block model, got " +
                             std::to_string(bn));
      if (!std::isfinite(threshold) || threshold < 0)
        fail("cache-threshold", "must be a finite number >= 0, got " + std::to_string(threshold));
      if (warmup < 0 || warmup > steps) fail("cache-warmup", "must be in " + range(0, steps) + ", got " + std::to_string(warmup));
      if (max_cached < -1) fail("cache-max-cached", "must be -1 (no limit) or >= 0, got " + std::to_string(max_cached));
      if (max_continuous < -1) fail("cache-max-continuous", "must be -1 (no limit) or >= 0, got " + std::to_string(max_continuous));
      if (taylorseer < 0 || taylorseer > 2) fail("taylorseer", "must be 1 or 2 (0: off), got " + std::to_string(taylorseer));
      return;
    }
  }
}

std::optional<std::string> CacheConfig::bypass_reason(int steps, int blocks) const {
  if (method != CacheMethod::attention && method != CacheMethod::dit_block) return std::nullopt;
  const int end_step = step_end.value_or(steps), end_block = block_end.value_or(blocks);
  if (step_start >= steps) return "--cache-step-start " + std::to_string(step_start) + " >= the " + std::to_string(steps) + " steps";
  if (end_step == step_start) return "--cache-step-end equals --cache-step-start";
  if (block_start >= blocks) return "--cache-block-start " + std::to_string(block_start) + " >= the " + std::to_string(blocks) + " blocks";
  if (end_block == block_start) return "--cache-block-end equals --cache-block-start";
  if (step_interval == 1) return "--cache-interval 1 computes every step";
  return std::nullopt;
}

std::unique_ptr<Stage> make_cache_stage(const CacheConfig& config, int steps, int blocks) {
  config.validate(steps, blocks);
  switch (config.method) {
    case CacheMethod::none: return nullptr;
    case CacheMethod::attention: return std::make_unique<AttentionCacheStage>(config, steps, blocks);
    case CacheMethod::dit_block: return std::make_unique<DiTBlockCacheStage>(config, steps, blocks);
    case CacheMethod::db: return std::make_unique<DbCacheStage>(config);
  }
  return nullptr;
}

}  // namespace cubevec::pipelines
