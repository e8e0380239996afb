// Reading and writing safetensors files. Reading memory-maps the file, validates the whole header
// (safetensors_format.h) and hands out zero-copy, read-only tensor views of the mapping.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/mapped_file.h"
#include "base/output_file.h"
#include "tensor/safetensors_format.h"
#include "tensor/tensor.h"

namespace cubevec {

class SafetensorsFile {
 public:
  // Maps and validates `path`; throws SafetensorsError (malformed) or Error (unreadable).
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  uint64_t file_size() const { return file_->bytes().size(); }
  uint64_t header_length() const { return header_.header_length; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const std::vector<SafetensorsEntry>& entries() const { return header_.entries; }  // in data order
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // throws naming the file and tensor

  // A read-only view of the tensor's bytes in the mapping (a copy only when the bytes are not
  // aligned to the element size). Throws for dtypes cubevec does not compute with (F64, F8, ...).
  Tensor tensor(const std::string& name) const;

 private:
  std::shared_ptr<const MappedFile> file_;
  SafetensorsHeader header_;
  std::map<std::string, std::size_t> index_;  // name -> position in header_.entries
};

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes tensors (any strides) in the reference writer's layout: higher dtype rank first, then by name,
// header padded with spaces to a multiple of 8. Written to a temporary file, then renamed
// (base/output_file.h): a failure leaves an existing file at `path` as it was.
void write_safetensors(const std::string& path, const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});
// The same into an open output; the caller commits it (several files replaced together).
void write_safetensors(OutputFile& out, const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});

}  // namespace cubevec
