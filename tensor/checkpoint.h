// A checkpoint: one safetensors file, or several shards named by a *.safetensors.index.json
// ({"metadata": {...}, "weight_map": {tensor name: shard file}}), behind one name -> tensor lookup.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tensor/safetensors.h"

namespace cubevec {

class Checkpoint {
 public:
  // `path` is a .safetensors file, an .index.json, or a directory holding exactly one index or,
  // failing that, exactly one .safetensors file. Every shard is validated on open, and so is the
  // index against them: each mapped name is in its shard, each shard tensor is mapped to it.
  static Checkpoint open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsFile>& shards() const { return shards_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsFile& shard_of(const std::string& name) const;  // throws naming the checkpoint
  const SafetensorsEntry& entry(const std::string& name) const { return shard_of(name).entry(name); }
  Tensor tensor(const std::string& name) const { return shard_of(name).tensor(name); }

 private:
  static Checkpoint open_index(const std::string& index_path);

  std::string path_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, std::size_t> where_;  // name -> shard position
};

}  // namespace cubevec
