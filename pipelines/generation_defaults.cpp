#include "pipelines/generation_defaults.h"

#include <filesystem>

#include "base/config_reader.h"
#include "base/strict_json.h"

namespace cubevec::pipelines {

namespace {

// Absent or null: no default. `min` is at least 1, so 0 marks "not read".
template <typename T>
void read_optional(ConfigReader& r, const std::string& key, std::optional<T>& out, int64_t min, int64_t max) {
  T value = 0;
  r.integer(key, value, min, max);
  if (value != 0) out = value;
}

}  // namespace

GenerationDefaults GenerationDefaults::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "generation defaults");
  GenerationDefaults d;
  read_optional(r, "width", d.width, 16, 8192);
  read_optional(r, "height", d.height, 16, 8192);
  read_optional(r, "frames", d.frames, 1, 4097);
  read_optional(r, "steps", d.steps, 1, 1000);
  double guidance = -1;  // below the range: not read
  r.number_in("guidance", guidance, 0.0, 100.0);
  if (guidance >= 0) d.guidance = guidance;
  r.reject_unknown();
  for (const auto& [key, value] : {std::pair{"width", d.width}, std::pair{"height", d.height}})
    if (value && *value % 16 != 0) r.fail(key, "must be a multiple of 16, got " + std::to_string(*value));
  if (d.frames && (*d.frames - 1) % 4 != 0) r.fail("frames", "must be 1 + 4k, got " + std::to_string(*d.frames));
  return d;
}

std::string GenerationDefaults::path(const std::string& model_dir) { return model_dir + "/generation_defaults.json"; }

GenerationDefaults GenerationDefaults::load(const std::string& model_dir) {
  const std::string file = path(model_dir);
  std::error_code error;
  if (!std::filesystem::exists(std::filesystem::symlink_status(file, error))) return {};
  return from_json(read_json_file(file), file);
}

}  // namespace cubevec::pipelines
