// A model folder's generation_defaults.json: the size, frame count, steps and guidance a model is
// meant to be rendered at, for the settings the command line leaves out. cubevec's shipped tiny
// video model has one (assets/tinywan: 64x64, 17 frames), so `cubevec t2v --model assets/tinywan`
// does not fall back to Wan2.1's 832x480 x 81 frames. It is cubevec's file, not diffusers'.
//
//   {"width": 64, "height": 64, "frames": 17, "steps": 30, "guidance": 5.0}
//
// The file is optional and so is every key; keys starting with '_' are comments. Any other key,
// a wrong type or a value out of range is an error naming the file and the key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace cubevec::pipelines {

struct GenerationDefaults {
  std::optional<int64_t> width, height;  // multiples of 16 in [16, 8192]
  std::optional<int64_t> frames;         // 1 + 4k, at most 4097
  std::optional<int> steps;              // [1, 1000]
  std::optional<double> guidance;        // [0, 100]

  static GenerationDefaults from_json(const nlohmann::json& json, const std::string& source);
  // path(model_dir); all empty when there is no such file.
  static GenerationDefaults load(const std::string& model_dir);
  // model_dir/generation_defaults.json, as errors name it.
  static std::string path(const std::string& model_dir);
};

}  // namespace cubevec::pipelines
