#include "server/request_body.h"

#include <charconv>
#include <cmath>

#include "base/config_reader.h"
#include "base/strict_json.h"
#include "server/api_error.h"

namespace cubevec::server {

namespace {

std::string type_name(const nlohmann::json& value) {
  if (value.is_string()) return "a string";
  if (value.is_boolean()) return "a boolean";
  if (value.is_number()) return "a number";
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  return "null";
}

const nlohmann::json* present(const nlohmann::json& body, const std::string& key) {
  const auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

nlohmann::json parse_body(const std::string& body, const std::string& content_type) {
  // curl -d sends JSON as application/x-www-form-urlencoded: the body decides. Multipart forms
  // (file uploads) are not a JSON body.
  if (content_type.find("multipart/form-data") != std::string::npos)
    throw ApiError(415, "invalid_request_error", "unsupported_media_type", "",
                   "the request body must be JSON (Content-Type: application/json), got a multipart form");
  if (body.empty()) throw invalid_request("", "the request body is empty; expected a JSON object", "invalid_json");
  nlohmann::json json;
  try {
    json = parse_strict_json(body, kMaxBodyDepth);
  } catch (const StrictJsonError& e) {
    throw invalid_request(
        "", std::string("the request body is ") + (e.kind() == StrictJsonError::Kind::Syntax ? "" : "not valid JSON: ") + e.what(),
        "invalid_json");
  }
  if (!json.is_object()) throw invalid_request("", "the request body must be a JSON object, got " + type_name(json), "invalid_json");
  return json;
}

std::optional<std::string> string_field(const nlohmann::json& body, const std::string& key, std::initializer_list<std::string_view> allowed,
                                        std::size_t max_chars) {
  const nlohmann::json* value = present(body, key);
  if (!value) return std::nullopt;
  if (!value->is_string())
    throw invalid_request(key, "'" + key + "' must be a string, got " + type_name(*value) + " " + json_for_message(*value), "invalid_type");
  std::string text = value->get<std::string>();
  if (text.size() > max_chars)
    throw invalid_request(
        key, "'" + key + "' is " + std::to_string(text.size()) + " bytes long; at most " + std::to_string(max_chars) + " are accepted");
  if (allowed.size() != 0) {
    std::string names;
    for (const std::string_view a : allowed) {
      if (text == a) return text;
      names += (names.empty() ? "" : ", ") + std::string(a);
    }
    throw invalid_request(key, "'" + key + "' must be one of " + names + ", got " + json_for_message(*value));
  }
  return text;
}

std::optional<int64_t> integer_field(const nlohmann::json& body, const std::string& key, int64_t min, int64_t max) {
  const nlohmann::json* value = present(body, key);
  if (!value) return std::nullopt;
  const std::string range = " in " + std::to_string(min) + ".." + std::to_string(max);
  if (value->is_number_float()) {
    const double d = value->get<double>();
    // Compared in double, then checked again as an integer: a max near 2^63 rounds up in double.
    if (!std::isfinite(d) || d != std::floor(d) || d < static_cast<double>(min) || d > static_cast<double>(max) || d >= 0x1p63 ||
        static_cast<int64_t>(d) > max)
      throw invalid_request(key, "'" + key + "' must be an integer" + range + ", got " + json_for_message(*value));
    return static_cast<int64_t>(d);
  }
  if (value->is_number_unsigned() && value->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw invalid_request(key, "'" + key + "' must be an integer" + range + ", got " + json_for_message(*value));
  if (!value->is_number_integer())
    throw invalid_request(key, "'" + key + "' must be an integer" + range + ", got " + type_name(*value) + " " + json_for_message(*value),
                          "invalid_type");
  const int64_t v = value->get<int64_t>();
  if (v < min || v > max) throw invalid_request(key, "'" + key + "' must be an integer" + range + ", got " + json_for_message(*value));
  return v;
}

std::optional<double> number_field(const nlohmann::json& body, const std::string& key, double min, double max) {
  const nlohmann::json* value = present(body, key);
  if (!value) return std::nullopt;
  const std::string range = " in [" + number_for_message(min) + ", " + number_for_message(max) + "]";
  if (!value->is_number())
    throw invalid_request(key, "'" + key + "' must be a number" + range + ", got " + type_name(*value) + " " + json_for_message(*value),
                          "invalid_type");
  const double v = value->get<double>();
  if (!std::isfinite(v) || v < min || v > max)
    throw invalid_request(key, "'" + key + "' must be a number" + range + ", got " + json_for_message(*value));
  return v;
}

std::optional<bool> boolean_field(const nlohmann::json& body, const std::string& key) {
  const nlohmann::json* value = present(body, key);
  if (!value) return std::nullopt;
  if (!value->is_boolean())
    throw invalid_request(key, "'" + key + "' must be true or false, got " + json_for_message(*value), "invalid_type");
  return value->get<bool>();
}

std::optional<std::pair<int64_t, int64_t>> size_field(const nlohmann::json& body, const std::string& key, int64_t max_side) {
  const std::optional<std::string> text = string_field(body, key, {}, 32);
  if (!text || *text == "auto") return std::nullopt;
  const std::string expected = "'" + key + "' must be \"WIDTHxHEIGHT\" (e.g. \"1024x1024\", each side 16.." + std::to_string(max_side) +
                               ") or \"auto\", got \"" + *text + "\"";
  const std::size_t x = text->find('x');
  if (x == std::string::npos) throw invalid_request(key, expected);
  int64_t width = 0, height = 0;
  const char* begin = text->data();
  const char* end = begin + text->size();
  const auto w = std::from_chars(begin, begin + x, width);
  const auto h = std::from_chars(begin + x + 1, end, height);
  if (x == 0 || w.ec != std::errc() || w.ptr != begin + x || h.ec != std::errc() || h.ptr != end || begin + x + 1 == end)
    throw invalid_request(key, expected);
  if (width < 16 || height < 16 || width > max_side || height > max_side) throw invalid_request(key, expected);
  return std::pair{width, height};
}

}  // namespace cubevec::server
