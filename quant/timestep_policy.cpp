#include "quant/timestep_policy.h"

#include "base/config_reader.h"
#include "base/error.h"
#include "base/strict_json.h"

namespace cubevec::quant {

void TimestepPolicy::register_steps(int first, int last, Strategy strategy) {
  if (first < 0 || last < first)
    throw Error("timestep policy: the step range [" + std::to_string(first) + ", " + std::to_string(last) + "] is empty or negative");
  for (int s = first; s <= last; ++s) steps_[s] = strategy;
}

Strategy TimestepPolicy::strategy(int step) const {
  const auto it = steps_.find(step);
  return it == steps_.end() ? default_ : it->second;
}

TimestepPolicy TimestepPolicy::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "timestep policy");
  TimestepPolicy policy;
  std::string fallback = "dynamic";
  r.text("default", fallback, {"static", "dynamic"});
  policy.default_ = fallback == "static" ? Strategy::static_scales : Strategy::dynamic;
  std::map<int, std::string> seen;  // step -> the list that named it
  for (const auto& [key, strategy] : {std::pair{"static", Strategy::static_scales}, std::pair{"dynamic", Strategy::dynamic}}) {
    const nlohmann::json& list = r.raw(key);
    if (list.is_null()) continue;
    if (!list.is_array()) r.fail(key, "must be a list of step indices or {\"from\": a, \"to\": b} ranges, got " + list.dump());
    for (const auto& item : list) {
      int first = -1, last = -1;
      if (item.is_number_integer() && item.get<int64_t>() >= 0 && item.get<int64_t>() < (1 << 20)) {
        first = last = item.get<int>();
      } else if (item.is_object() && item.size() == 2 && item.contains("from") && item.contains("to") && item["from"].is_number_integer() &&
                 item["to"].is_number_integer() && item["from"].get<int64_t>() >= 0 &&
                 item["to"].get<int64_t>() >= item["from"].get<int64_t>() && item["to"].get<int64_t>() < (1 << 20)) {
        first = item["from"].get<int>(), last = item["to"].get<int>();
      } else {
        r.fail(key, "entries must be step indices >= 0 or {\"from\": a, \"to\": b} with 0 <= a <= b, got " + item.dump());
      }
      for (int s = first; s <= last; ++s)
        if (const auto [it, added] = seen.emplace(s, key); !added && it->second != key)
          r.fail(key, "names step " + std::to_string(s) + ", which \"" + it->second + "\" names too");
      policy.register_steps(first, last, strategy);
    }
  }
  r.reject_unknown();
  return policy;
}

TimestepPolicy TimestepPolicy::load(const std::string& path) { return from_json(read_json_file(path), path); }

}  // namespace cubevec::quant
