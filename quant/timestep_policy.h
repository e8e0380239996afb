// MindIE SD's TimestepPolicyConfig: which denoising steps a W8A8_TIMESTEP layer runs with its
// static (calibrated per step) scales and which with dynamic per-token ones; unregistered steps
// take the default ("dynamic", as MindIE). From a JSON file:
//   {"default": "dynamic", "static": [0, 1, 2], "dynamic": [40, 41]}
// ("static" / "dynamic" list step indices from 0, or [first, last] ranges as {"from": a, "to": b}).
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

namespace cubevec::quant {

enum class Strategy { static_scales, dynamic };

class TimestepPolicy {
 public:
  void register_steps(int first, int last, Strategy strategy);  // inclusive; throws for a negative or empty range
  Strategy strategy(int step) const;
  Strategy default_strategy() const { return default_; }
  void set_default(Strategy strategy) { default_ = strategy; }

  static TimestepPolicy from_json(const nlohmann::json& json, const std::string& source);
  static TimestepPolicy load(const std::string& path);

 private:
  Strategy default_ = Strategy::dynamic;
  std::map<int, Strategy> steps_;
};

}  // namespace cubevec::quant
