// `cubevec inspect PATH`: what a safetensors file or sharded checkpoint holds, after full validation.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/output_flag.h"
#include "cli/command.h"
#include "tensor/checkpoint.h"
#include "base/output_file.h"
#include "base/json_text.h"

namespace cubevec::cli {

namespace {

struct Row {
  std::string name, dtype, shape, bytes, offset, shard;
};

std::string with_commas(uint64_t value) {
  std::string digits = std::to_string(value);
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(static_cast<std::size_t>(i), ",");
  return digits;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// Names and metadata come from the file: control characters (an escape sequence could rewrite the
// terminal) are shown as \xNN, and a backslash as \\ so the escape is unambiguous.
std::string printable(const std::string& text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == '\\') {
      char hex[8];
      std::snprintf(hex, sizeof hex, c == '\\' ? "\\\\" : "\\x%02x", u);
      out += hex;
    } else {
      out += c;
    }
  }
  return out;
}

std::string file_name(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

void print_table(const std::vector<Row>& rows, bool with_shard) {
  Row header{"name", "dtype", "shape", "bytes", "offset", "shard"};
  std::size_t w[6] = {};
  const auto widen = [&](const Row& r) {
    const std::string* cells[] = {&r.name, &r.dtype, &r.shape, &r.bytes, &r.offset, &r.shard};
    for (int i = 0; i < 6; ++i) w[i] = std::max(w[i], cells[i]->size());
  };
  widen(header);
  for (const Row& r : rows) widen(r);
  const auto print = [&](const Row& r) {
    std::printf("%-*s  %-*s  %-*s  %*s  %*s", int(w[0]), r.name.c_str(), int(w[1]), r.dtype.c_str(), int(w[2]), r.shape.c_str(), int(w[3]),
                r.bytes.c_str(), int(w[4]), r.offset.c_str());
    if (with_shard) std::printf("  %s", r.shard.c_str());
    std::printf("\n");
  };
  print(header);
  for (const Row& r : rows) print(r);
}

int run_inspect(const std::string& path, const std::string& json_path) {
  const Checkpoint checkpoint = Checkpoint::open(path);
  const bool sharded = checkpoint.shards().size() > 1;
  std::vector<Row> rows;
  nlohmann::ordered_json json = {{"path", path}, {"shards", nlohmann::json::array()}, {"tensors", nlohmann::json::array()}};
  uint64_t total_bytes = 0, total_elements = 0;
  std::map<std::string, uint64_t> count_by_dtype;

  std::printf("%s\n", path.c_str());
  for (const SafetensorsFile& shard : checkpoint.shards()) {
    std::printf("  %s: %s bytes, header %s bytes, %zu tensors\n", file_name(shard.path()).c_str(), with_commas(shard.file_size()).c_str(),
                with_commas(shard.header_length()).c_str(), shard.entries().size());
    for (const auto& [key, value] : shard.metadata())
      std::printf("    metadata %s = %s\n", printable(key).c_str(), printable(value).c_str());
    json["shards"].push_back({{"file", shard.path()},
                              {"file_size", shard.file_size()},
                              {"header_length", shard.header_length()},
                              {"metadata", shard.metadata()}});
    for (const SafetensorsEntry& e : shard.entries()) {
      uint64_t elements = 1;
      for (uint64_t size : e.shape) elements *= size;  // validated: cannot overflow
      total_elements += elements;
      total_bytes += e.end - e.begin;
      count_by_dtype[std::string(e.dtype->name)] += 1;
      rows.push_back({printable(e.name), std::string(e.dtype->name), shape_text(e.shape), with_commas(e.end - e.begin),
                      with_commas(e.begin), file_name(shard.path())});
      json["tensors"].push_back({{"name", e.name},
                                 {"dtype", e.dtype->name},
                                 {"shape", e.shape},
                                 {"bytes", e.end - e.begin},
                                 {"offset", e.begin},
                                 {"shard", file_name(shard.path())}});
    }
  }
  std::printf("\n");
  print_table(rows, sharded);
  std::string dtypes;
  for (const auto& [dtype, count] : count_by_dtype) dtypes += (dtypes.empty() ? "" : ", ") + dtype + " " + std::to_string(count);
  std::printf("\ntotal: %zu tensors (%s), %s elements, %s bytes of tensor data\n", rows.size(), dtypes.empty() ? "none" : dtypes.c_str(),
              with_commas(total_elements).c_str(), with_commas(total_bytes).c_str());
  json["total_tensors"] = rows.size();
  json["total_elements"] = total_elements;
  json["total_bytes"] = total_bytes;

  if (!json_path.empty()) {
    write_output_file(json_path, "--json", dump_json(json, 2) + "\n");
  }
  return 0;
}

}  // namespace

CommandRunner add_inspect_command(CLI::App& app) {
  auto* command = app.add_subcommand("inspect", "Validate a safetensors file, sharded index or checkpoint directory and list its tensors");
  auto path = std::make_shared<std::string>();
  auto json_path = std::make_shared<std::string>();
  command->add_option("path", *path, "A .safetensors file, a .safetensors.index.json, or a directory")->required();
  command->add_option("--json", *json_path, "Also write the listing as JSON to this file")->check(output_file_path());
  return [path, json_path] { return run_inspect(*path, *json_path); };
}

}  // namespace cubevec::cli
