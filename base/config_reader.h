// Reads a config object (a diffusers config.json, scheduler_config.json, a cache config, ...) key
// by key, with one error format: "<source>: '<key>' must be <what>, got <value>". Each read marks
// its key as known, so a model config can reject the keys nobody asked for (a typo, or a feature
// cubevec does not have) while a scheduler config ignores them, as diffusers does.
//
//   ConfigReader r(json, path, "FluxTransformer2DModel");
//   r.expect_class({"FluxTransformer2DModel"});
//   r.integer("num_layers", c.num_layers, 0).integer("attention_head_dim", c.attention_head_dim, 2);
//   r.reject_unknown();
#pragma once

#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace cubevec {

// The largest integer a config may hold unless a key states otherwise: far above any model
// dimension, low enough that products of a few of them cannot overflow int64.
inline constexpr int64_t kMaxConfigInt = int64_t{1} << 24;

// A value as an error message shows it: its JSON on one line, cut short at 80 characters so a huge
// value cannot flood the terminal or an HTTP answer.
std::string json_for_message(const nlohmann::json& value);

class ConfigReader {
 public:
  // `json` must be an object (else an Error naming `source` and `what`); `what` names the config
  // kind in messages ("FluxTransformer2DModel").
  ConfigReader(const nlohmann::json& json, std::string source, std::string what);

  const std::string& source() const { return source_; }
  // `_class_name`, when present, must be one of `names`.
  ConfigReader& expect_class(std::initializer_list<std::string_view> names);
  bool contains(const std::string& key) const { return json_.contains(key); }
  bool has(const std::string& key) const { return json_.contains(key) && !json_[key].is_null(); }  // present, not null
  // The raw value (marks the key as known); null when absent.
  const nlohmann::json& raw(const std::string& key);

  // Each reader: absent or null leaves `out` as it is (the default); otherwise the value must have
  // the type and range, else an Error naming the source, the key, what was expected and the value.
  ConfigReader& integer(const std::string& key, int64_t& out, int64_t min, int64_t max = kMaxConfigInt);
  ConfigReader& integer(const std::string& key, int& out, int64_t min, int64_t max = kMaxConfigInt);
  // Any integer in [0, 2^64 - 1] (a seed: JSON text may hold every uint64_t).
  ConfigReader& unsigned_integer(const std::string& key, uint64_t& out);
  ConfigReader& number(const std::string& key, double& out);                             // any finite number
  ConfigReader& positive_number(const std::string& key, double& out);                    // finite and > 0
  ConfigReader& number_in(const std::string& key, double& out, double min, double max);  // finite, in [min, max]
  ConfigReader& boolean(const std::string& key, bool& out);
  // A string; when `allowed` is not empty, one of those.
  ConfigReader& text(const std::string& key, std::string& out, std::initializer_list<std::string_view> allowed = {});
  // A non-empty list of integers (`size` > 0: exactly that many).
  ConfigReader& integers(const std::string& key, std::vector<int64_t>& out, int64_t min, std::size_t size = 0, int64_t max = kMaxConfigInt);
  // Lists of any length.
  ConfigReader& numbers(const std::string& key, std::vector<double>& out);  // finite numbers
  ConfigReader& booleans(const std::string& key, std::vector<bool>& out);
  ConfigReader& texts(const std::string& key, std::vector<std::string>& out);
  // Keys this reader knows but does not use (checked for nothing).
  ConfigReader& ignore(std::initializer_list<std::string_view> keys);

  // Every key in `keys` must be present.
  void require(std::initializer_list<std::string_view> keys) const;
  // Keys no read asked for (keys starting with '_' aside) are an error naming the first.
  void reject_unknown() const;
  // "<source>: '<key>' <message>"
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;

 private:
  const nlohmann::json* value_of(const std::string& key);  // null when absent or null; marks known

  const nlohmann::json& json_;
  std::string source_, what_;
  std::set<std::string> known_;
};

}  // namespace cubevec
