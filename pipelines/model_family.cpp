#include "pipelines/model_family.h"

#include <filesystem>

#include "base/error.h"
#include "base/strict_json.h"

namespace cubevec::pipelines {

const std::vector<ModelFamilyEntry>& model_families() {
  // The registry: one line per family.
  static const std::vector<ModelFamilyEntry> families = {flux_family(), wan_family()};
  return families;
}

const ModelFamilyEntry& model_family(const std::string& name) {
  for (const ModelFamilyEntry& family : model_families())
    if (name == family.family) return family;
  throw Error("no model family named \"" + name + "\"");
}

std::unique_ptr<ModelPipeline> load_model_pipeline_meta(const std::string& model_dir, DType dtype) {
  std::error_code error;  // a symlink loop or an unreadable folder is a message, not an exception
  if (!std::filesystem::is_directory(model_dir, error))
    throw Error(model_dir + ": " + (error && error != std::errc::no_such_file_or_directory ? error.message() : "no such model folder") +
                " (expected a diffusers folder: transformer/, vae/, scheduler/, text encoders)");
  if (!std::filesystem::exists(model_dir + "/transformer/config.json", error))
    throw Error(model_dir + ": not a diffusers model folder (expected transformer/config.json, vae/ and scheduler/)" +
                (error ? " (" + error.message() + ")" : std::string()));
  const std::string config_path = model_dir + "/transformer/config.json";
  const nlohmann::json config = read_json_file(config_path);
  const std::string class_name = config.is_object() && config.contains("_class_name") && config["_class_name"].is_string()
                                     ? config["_class_name"].get<std::string>()
                                     : std::string();
  std::string known;
  for (const ModelFamilyEntry& family : model_families()) {
    if (class_name == family.transformer_class) return family.load_meta(model_dir, dtype);
    known += std::string(known.empty() ? "" : ", ") + family.transformer_class;
  }
  throw Error(config_path + ": '_class_name' must name a transformer cubevec can generate with (" + known + "), got " +
              (class_name.empty() ? std::string("none") : "\"" + class_name + "\""));
}

}  // namespace cubevec::pipelines
