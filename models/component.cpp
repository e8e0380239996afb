#include "models/component.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "base/error.h"

namespace cubevec::models {

namespace fs = std::filesystem;

Checkpoint open_component_weights(const std::string& dir, const std::string& variant, const std::string& name) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(dir + ": not a directory (expected a model component folder with " + name + ".safetensors)");
  const std::string infix = variant.empty() ? "" : "." + variant;
  const std::string index = name + ".safetensors.index" + infix + ".json", single = name + infix + ".safetensors";
  for (const std::string& file : {index, single}) {
    const fs::path path = fs::path(dir) / file;
    // Present but a directory, FIFO or device: Checkpoint::open names it as not a regular file.
    if (fs::exists(fs::symlink_status(path, ec))) return Checkpoint::open(path.string());
  }
  std::vector<std::string> present;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".safetensors" || entry.path().filename().string().ends_with(".index.json"))
      present.push_back(entry.path().filename().string());
  std::sort(present.begin(), present.end());
  std::string list;
  for (const std::string& file : present) list += (list.empty() ? "" : ", ") + file;
  throw Error(dir + ": no " + single + " or " + index + (present.empty() ? " (no safetensors files here)" : " (here: " + list + ")") +
              (variant.empty() && !present.empty() ? "; a variant such as " + name + ".fp16.safetensors is read with --variant fp16" : ""));
}

}  // namespace cubevec::models
