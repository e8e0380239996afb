// Reading a JSON request body field by field, with OpenAI's rules: a body that is not a JSON object
// (or nests deeper than a request ever does) is a 400; a field of the wrong type or out of range is
// a 400 naming it; a field nobody reads is ignored.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace cubevec::server {

inline constexpr int kMaxBodyDepth = 8;                // the deepest a request nests ("cache": {...} is 2)
inline constexpr std::size_t kMaxPromptChars = 32000;  // OpenAI's limit for a prompt

// `what` names the body in errors ("the request body").
nlohmann::json parse_body(const std::string& body, const std::string& content_type);

// Absent or null: nullopt. Present: the type and range, or an ApiError 400 naming the field.
std::optional<std::string> string_field(const nlohmann::json& body, const std::string& key,
                                        std::initializer_list<std::string_view> allowed = {}, std::size_t max_chars = kMaxPromptChars);
std::optional<int64_t> integer_field(const nlohmann::json& body, const std::string& key, int64_t min, int64_t max);
std::optional<double> number_field(const nlohmann::json& body, const std::string& key, double min, double max);
std::optional<bool> boolean_field(const nlohmann::json& body, const std::string& key);

// "WxH" (OpenAI's size): each side in [16, max_side]; "auto" or absent: nullopt.
std::optional<std::pair<int64_t, int64_t>> size_field(const nlohmann::json& body, const std::string& key, int64_t max_side);

}  // namespace cubevec::server
