#include "tensor/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/regular_file.h"
#include "base/strict_json.h"

namespace cubevec {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The single file in `dir` whose name ends with `suffix`, "" if none; throws if there are several.
std::string only_file_ending_with(const fs::path& dir, std::string_view suffix) {
  std::string found;
  std::error_code ec;
  fs::directory_iterator items(dir, ec);
  if (ec) throw Error(dir.string() + ": cannot list the directory: " + ec.message());
  for (const auto& item : items) {
    const std::string name = item.path().filename().string();
    if (!item.is_regular_file() || !ends_with(name, suffix)) continue;
    if (!found.empty())
      throw Error(dir.string() + ": holds several *" + std::string(suffix) + " files (" + fs::path(found).filename().string() + ", " +
                  name + "); name the one to load");
    found = item.path().string();
  }
  return found;
}

std::string read_text_file(const std::string& path) { return read_regular_file(path); }

}  // namespace

Checkpoint Checkpoint::open(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::string chosen = only_file_ending_with(path, ".safetensors.index.json");
    if (chosen.empty()) chosen = only_file_ending_with(path, ".safetensors");
    if (chosen.empty()) throw Error(path + ": directory holds no .safetensors file and no .safetensors.index.json");
    return open(chosen);
  }
  if (ends_with(path, ".json")) return open_index(path);
  Checkpoint checkpoint;
  checkpoint.path_ = path;
  checkpoint.shards_.push_back(SafetensorsFile::open(path));
  for (const auto& e : checkpoint.shards_[0].entries()) checkpoint.where_[e.name] = 0;
  return checkpoint;
}

Checkpoint Checkpoint::open_index(const std::string& index_path) {
  std::error_code ec;
  nlohmann::json index;
  try {
    index = parse_strict_json(read_text_file(index_path), 2);  // object > weight_map / metadata > values
  } catch (const StrictJsonError& e) {
    throw Error(index_path + ": " + e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw Error(index_path + ": expected a JSON object with a \"weight_map\" object {tensor name: shard file}");

  Checkpoint checkpoint;
  checkpoint.path_ = index_path;
  std::map<std::string, std::size_t> shard_position;
  const fs::path dir = fs::path(index_path).parent_path();
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string())
      throw Error(index_path + ": weight_map entry '" + name + "' is a JSON " + shard.type_name() + ", expected a file name");
    const std::string file = shard.get<std::string>();
    // Shards live beside the index: a path could make a crafted index read any file on the machine.
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      throw Error(index_path + ": weight_map entry '" + name + "' names shard '" + file +
                  "', expected a plain file name in the index's directory");
    auto [it, added] = shard_position.emplace(file, checkpoint.shards_.size());
    if (added) {
      const std::string shard_path = (dir / file).string();
      if (!fs::exists(shard_path, ec))
        throw Error(index_path + ": weight_map puts tensor '" + name + "' in shard " + shard_path + ", which does not exist");
      checkpoint.shards_.push_back(SafetensorsFile::open(shard_path));
    }
    const SafetensorsFile& opened = checkpoint.shards_[it->second];
    if (!opened.contains(name))
      throw Error(index_path + ": weight_map puts tensor '" + name + "' in " + file + ", which has no such tensor");
    checkpoint.where_[name] = it->second;
  }
  for (const SafetensorsFile& shard : checkpoint.shards_)
    for (const auto& e : shard.entries()) {
      const auto it = checkpoint.where_.find(e.name);
      if (it == checkpoint.where_.end())
        throw Error(index_path + ": shard " + shard.path() + " holds tensor '" + e.name + "', which weight_map does not list");
      if (&checkpoint.shards_[it->second] != &shard)
        throw Error(index_path + ": tensor '" + e.name + "' is in two shards (" + shard.path() + " and " +
                    checkpoint.shards_[it->second].path() + ")");
    }
  return checkpoint;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> names;
  for (const auto& [name, shard] : where_) names.push_back(name);
  return names;
}

const SafetensorsFile& Checkpoint::shard_of(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end())
    throw Error(path_ + ": no tensor named '" + name + "' in this checkpoint (" + std::to_string(where_.size()) + " tensors)");
  return shards_[it->second];
}

}  // namespace cubevec
