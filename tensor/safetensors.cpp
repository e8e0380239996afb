#include "tensor/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "base/json_text.h"

namespace cubevec {

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile file;
  file.file_ = MappedFile::open(path);
  file.header_ = parse_safetensors(file.file_->bytes(), path);
  for (std::size_t i = 0; i < file.header_.entries.size(); ++i) file.index_[file.header_.entries[i].name] = i;
  return file;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end())
    throw Error(path() + ": no tensor named '" + name + "' (the file holds " + std::to_string(index_.size()) + " tensors)");
  return header_.entries[it->second];
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  if (!e.dtype->dtype)
    throw Error(path() + ": tensor '" + name + "' has dtype " + std::string(e.dtype->name) +
                ", which cubevec does not support (supported: F32, F16, BF16, I8, U8, I32, I64, BOOL)");
  const DType dtype = *e.dtype->dtype;
  Shape shape;
  for (uint64_t size : e.shape) {
    if (size > static_cast<uint64_t>(INT64_MAX)) throw Error(path() + ": tensor '" + name + "' has a dimension above 2^63");
    shape.push_back(static_cast<int64_t>(size));
  }
  const std::byte* bytes = file_->bytes().data() + header_.data_start + e.begin;
  const std::size_t nbytes = e.end - e.begin;
  auto storage = Storage::borrow(bytes, nbytes, file_, /*read_only=*/true, /*file_mapped=*/true);
  Strides strides = contiguous_strides(shape);
  Tensor view = Tensor::from_storage(std::move(storage), std::move(shape), std::move(strides), 0, dtype);
  // Writers other than the reference one need not align tensors; kernels may assume alignment.
  if (reinterpret_cast<std::uintptr_t>(bytes) % dtype_size(dtype) != 0) return view.clone();
  return view;
}

void write_safetensors(OutputFile& out, const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  const std::string& path = out.path();
  std::vector<const std::pair<std::string, Tensor>*> order;
  std::set<std::string> names;
  for (const auto& item : tensors) {
    if (item.first == "__metadata__") throw Error(path + ": '__metadata__' is reserved and cannot name a tensor");
    if (!names.insert(item.first).second) throw Error(path + ": tensor name '" + item.first + "' given twice");
    if (!item.second.defined() || !item.second.has_storage())
      throw Error(path + ": tensor '" + item.first + "' has no data to write (" + item.second.describe() + ")");
    order.push_back(&item);
  }
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    const int ra = safetensors_dtype_rank(a->second.dtype()), rb = safetensors_dtype_rank(b->second.dtype());
    return ra != rb ? ra > rb : a->first < b->first;
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto* item : order) {
    const Tensor& t = item->second;
    header[item->first] = {
        {"dtype", safetensors_dtype_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = dump_json(header);  // tensor names and metadata may hold any bytes
  text.append((8 - text.size() % 8) % 8, ' ');

  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  out.write(length, 8);
  out.write(text);
  for (const auto* item : order) {
    const Tensor data = item->second.contiguous();
    out.write(data.data_ptr(), data.nbytes());
  }
}

void write_safetensors(const std::string& path, const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  OutputFile out(path, "safetensors output");
  write_safetensors(out, tensors, metadata);
  out.commit();
}

}  // namespace cubevec
