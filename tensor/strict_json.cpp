#include "tensor/strict_json.h"

#include "tensor/regular_file.h"

#include <set>
#include <vector>

namespace cubevec {

nlohmann::json parse_strict_json(std::string_view text, int max_depth) {
  using Event = nlohmann::json::parse_event_t;
  std::vector<std::set<std::string>> open_objects;  // keys seen in each object being parsed
  const auto callback = [&](int depth, Event event, nlohmann::json& parsed) {
    if ((event == Event::object_start || event == Event::array_start) && depth > max_depth)
      throw StrictJsonError(StrictJsonError::Kind::TooDeep, depth,
                            "JSON nests deeper than the " + std::to_string(max_depth) + " levels expected");
    if (event == Event::object_start) open_objects.emplace_back();
    if (event == Event::object_end) open_objects.pop_back();
    if (event == Event::key && !open_objects.back().insert(parsed.get<std::string>()).second)
      throw StrictJsonError(StrictJsonError::Kind::DuplicateKey, depth,
                            "the key '" + parsed.get<std::string>() + "' appears more than once in one object");
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::exception& e) {
    throw StrictJsonError(StrictJsonError::Kind::Syntax, 0, std::string("not valid JSON: ") + e.what());
  }
}

nlohmann::json read_json_file(const std::string& path, int max_depth) {
  const std::string text = read_regular_file(path);
  try {
    return parse_strict_json(text, max_depth);
  } catch (const StrictJsonError& e) {
    throw Error(path + ": " + (e.kind() == StrictJsonError::Kind::Syntax ? "" : "not valid JSON: ") + e.what());
  }
}

}  // namespace cubevec
