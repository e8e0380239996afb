#include "base/config_reader.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "base/error.h"
#include "base/strict_json.h"

namespace cubevec {

namespace {

std::string range_text(int64_t min, int64_t max) {
  if (max == std::numeric_limits<int64_t>::max()) return ">= " + std::to_string(min);
  return "in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
}

}  // namespace

std::string json_for_message(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

ConfigReader::ConfigReader(const nlohmann::json& json, std::string source, std::string what)
    : json_(json), source_(std::move(source)), what_(std::move(what)) {
  if (!json_.is_object()) throw Error(source_ + ": expected a JSON object (a " + what_ + " config), got " + json_for_message(json_));
}

ConfigReader& ConfigReader::expect_class(std::initializer_list<std::string_view> names) {
  if (!json_.contains("_class_name")) return *this;
  const nlohmann::json& v = json_["_class_name"];
  for (std::string_view name : names)
    if (v.is_string() && v.get<std::string>() == name) return *this;
  std::string list;
  for (std::string_view name : names) list += (list.empty() ? "\"" : ", \"") + std::string(name) + "\"";
  throw Error(source_ + ": this is a " + json_for_message(v) + " config; expected " + list);
}

const nlohmann::json* ConfigReader::value_of(const std::string& key) {
  known_.insert(key);
  if (!json_.contains(key) || json_[key].is_null()) return nullptr;
  return &json_[key];
}

const nlohmann::json& ConfigReader::raw(const std::string& key) {
  static const nlohmann::json null_value;
  const nlohmann::json* v = value_of(key);
  return v ? *v : null_value;
}

void ConfigReader::fail(const std::string& key, const std::string& message) const { throw Error(source_ + ": '" + key + "' " + message); }

ConfigReader& ConfigReader::integer(const std::string& key, int64_t& out, int64_t min, int64_t max) {
  const nlohmann::json* v = value_of(key);
  if (!v) return *this;
  if (!is_int64(*v) || v->get<int64_t>() < min || v->get<int64_t>() > max)
    fail(key, "must be an integer " + range_text(min, max) + ", got " + json_for_message(*v));
  out = v->get<int64_t>();
  return *this;
}

ConfigReader& ConfigReader::integer(const std::string& key, int& out, int64_t min, int64_t max) {
  int64_t wide = out;
  integer(key, wide, min, std::min<int64_t>(max, std::numeric_limits<int>::max()));
  out = static_cast<int>(wide);
  return *this;
}

ConfigReader& ConfigReader::unsigned_integer(const std::string& key, uint64_t& out) {
  const nlohmann::json* v = value_of(key);
  if (!v) return *this;
  if (!v->is_number_integer() || (!v->is_number_unsigned() && v->get<int64_t>() < 0))
    fail(key, "must be an integer in [0, 18446744073709551615], got " + json_for_message(*v));
  out = v->get<uint64_t>();
  return *this;
}

ConfigReader& ConfigReader::number(const std::string& key, double& out) {
  const nlohmann::json* v = value_of(key);
  if (!v) return *this;
  if (!v->is_number() || !std::isfinite(v->get<double>())) fail(key, "must be a finite number, got " + json_for_message(*v));
  out = v->get<double>();
  return *this;
}

ConfigReader& ConfigReader::positive_number(const std::string& key, double& out) {
  const nlohmann::json* v = value_of(key);
  if (!v) return *this;
  if (!v->is_number() || !std::isfinite(v->get<double>()) || !(v->get<double>() > 0))
    fail(key, "must be a positive finite number, got " + json_for_message(*v));
  out = v->get<double>();
  return *this;
}

ConfigReader& ConfigReader::number_in(const std::string& key, double& out, double min, double max) {
  const nlohmann::json* v = value_of(key);
  if (!v) return *this;
  if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < min || v->get<double>() > max) {
    char range[96];
    std::snprintf(range, sizeof range, "in [%g, %g]", min, max);
    fail(key, "must be a number " + std::string(range) + ", got " + json_for_message(*v));
  }
  out = v->get<double>();
  return *this;
}

ConfigReader& ConfigReader::boolean(const std::string& key, bool& out) {
  const nlohmann::json* v = value_of(key);
  if (!v) return *this;
  if (!v->is_boolean()) fail(key, "must be true or false, got " + json_for_message(*v));
  out = v->get<bool>();
  return *this;
}

ConfigReader& ConfigReader::text(const std::string& key, std::string& out, std::initializer_list<std::string_view> allowed) {
  const nlohmann::json* v = value_of(key);
  if (!v) return *this;
  std::string list;
  for (std::string_view a : allowed) list += (list.empty() ? "\"" : ", \"") + std::string(a) + "\"";
  if (!v->is_string()) fail(key, "must be a string" + (list.empty() ? "" : " (one of " + list + ")") + ", got " + json_for_message(*v));
  const std::string value = v->get<std::string>();
  if (allowed.size() != 0) {
    bool ok = false;
    for (std::string_view a : allowed) ok = ok || value == a;
    if (!ok) fail(key, "must be one of " + list + ", got " + json_for_message(*v));
  }
  out = value;
  return *this;
}

ConfigReader& ConfigReader::integers(const std::string& key, std::vector<int64_t>& out, int64_t min, std::size_t size, int64_t max) {
  const nlohmann::json* v = value_of(key);
  if (!v) return *this;
  const std::string what = size > 0 ? "a list of " + std::to_string(size) + " integers " + range_text(min, max)
                                    : "a non-empty list of integers " + range_text(min, max);
  if (!v->is_array() || v->empty() || (size > 0 && v->size() != size)) fail(key, "must be " + what + ", got " + json_for_message(*v));
  std::vector<int64_t> values;
  for (const auto& e : *v) {
    if (!is_int64(e) || e.get<int64_t>() < min || e.get<int64_t>() > max)
      fail(key, "entry " + std::to_string(values.size()) + " must be an integer " + range_text(min, max) + ", got " + json_for_message(e));
    values.push_back(e.get<int64_t>());
  }
  out = std::move(values);
  return *this;
}

ConfigReader& ConfigReader::numbers(const std::string& key, std::vector<double>& out) {
  const nlohmann::json* v = value_of(key);
  if (!v) return *this;
  std::vector<double> values;
  if (!v->is_array()) fail(key, "must be a list of finite numbers, got " + json_for_message(*v));
  for (const auto& e : *v) {
    if (!e.is_number() || !std::isfinite(e.get<double>())) fail(key, "must be a list of finite numbers, got " + json_for_message(*v));
    values.push_back(e.get<double>());
  }
  out = std::move(values);
  return *this;
}

ConfigReader& ConfigReader::booleans(const std::string& key, std::vector<bool>& out) {
  const nlohmann::json* v = value_of(key);
  if (!v) return *this;
  std::vector<bool> values;
  if (!v->is_array()) fail(key, "must be a list of true / false, got " + json_for_message(*v));
  for (const auto& e : *v) {
    if (!e.is_boolean()) fail(key, "must be a list of true / false, got " + json_for_message(*v));
    values.push_back(e.get<bool>());
  }
  out = std::move(values);
  return *this;
}

ConfigReader& ConfigReader::texts(const std::string& key, std::vector<std::string>& out) {
  const nlohmann::json* v = value_of(key);
  if (!v) return *this;
  std::vector<std::string> values;
  if (!v->is_array()) fail(key, "must be a list of strings, got " + json_for_message(*v));
  for (const auto& e : *v) {
    if (!e.is_string()) fail(key, "must be a list of strings, got " + json_for_message(*v));
    values.push_back(e.get<std::string>());
  }
  out = std::move(values);
  return *this;
}

ConfigReader& ConfigReader::ignore(std::initializer_list<std::string_view> keys) {
  for (std::string_view key : keys) known_.insert(std::string(key));
  return *this;
}

void ConfigReader::require(std::initializer_list<std::string_view> keys) const {
  for (std::string_view key : keys)
    if (!json_.contains(std::string(key))) throw Error(source_ + ": missing required key '" + std::string(key) + "'");
}

void ConfigReader::reject_unknown() const {
  for (const auto& [key, value] : json_.items()) {
    if (!key.empty() && key[0] == '_') continue;  // _class_name, _diffusers_version, _name_or_path, ...
    if (!known_.count(key)) throw Error(source_ + ": unknown key '" + key + "' for " + what_);
  }
}

}  // namespace cubevec
