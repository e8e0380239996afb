// JSON documents cubevec writes (reports, answers, events) from strings that may not be UTF-8: a
// path on Linux is bytes, and nlohmann's dump() throws on a string that is not UTF-8. Each byte
// that is not part of valid UTF-8 is written as the four characters \xHH (as Python's
// "backslashreplace"), so the document is always valid JSON and the bytes stay readable; valid
// text is unchanged.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace cubevec {

// `text` if it is UTF-8, else the same with every offending byte as \xHH.
std::string utf8_or_escaped(std::string_view text);

// A copy of `json` whose strings and keys are all UTF-8 (utf8_or_escaped).
template <class Json>
Json utf8_json(const Json& json) {
  if (json.is_string()) return Json(utf8_or_escaped(json.template get_ref<const std::string&>()));
  if (json.is_array()) {
    Json out = Json::array();
    for (const auto& item : json) out.push_back(utf8_json(item));
    return out;
  }
  if (json.is_object()) {
    Json out = Json::object();
    for (auto it = json.begin(); it != json.end(); ++it) out[utf8_or_escaped(it.key())] = utf8_json(it.value());
    return out;
  }
  return json;
}

// json.dump(indent), with the strings made UTF-8 first.
template <class Json>
std::string dump_json(const Json& json, int indent = -1) {
  return utf8_json(json).dump(indent);
}

}  // namespace cubevec
