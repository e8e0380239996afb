#include "models/packed_cache.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <system_error>

#include "base/content_hash.h"
#include "base/error.h"
#include "base/json_text.h"
#include "base/output_file.h"
#include "base/regular_file.h"
#include "models/layers.h"
#include "ops/gemm/cpu_caches.h"
#include "ops/gemm/driver.h"
#include "tensor/mapped_file.h"

namespace cubevec::models {

namespace g = ops::gemm;

namespace {

constexpr char kMagic[8] = {'C', 'V', 'P', 'A', 'C', 'K', '0', '1'};
constexpr std::size_t kPreamble = 16;                    // the magic and the header's length
constexpr uint64_t kAlign = 4096;                        // every layer's panels start on a page
constexpr uint64_t kMaxHeaderBytes = uint64_t{8} << 20;  // a real header is ~220 bytes a layer
constexpr int kFormatVersion = 1;
constexpr const char* kFormatName = "cubevec packed GEMM panels";

uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// One cached Linear: what this process would pack for it now, and where the file keeps it.
struct CachedLayer {
  std::string key;  // "<component>/<module name>"
  const Linear* linear = nullptr;
  int64_t n = 0, k = 0;
  g::Element compute = g::Element::f32;
  g::PackedLayout layout;
  uint64_t weight_hash = 0, panel_hash = 0, offset = 0;
};

std::string compute_name(g::Element e) { return e == g::Element::bf16 ? "bf16" : "f32"; }

std::vector<CachedLayer> layers_of(const PackedCacheModel& model) {
  std::vector<CachedLayer> layers;
  const g::Isa isa = g::best_isa();
  for (const auto& [component, table] : model.tables)
    for (const auto& [name, linear] : table->linears()) {
      if (linear->kernel || !linear->weight.has_storage()) continue;
      CachedLayer layer;
      layer.key = component + "/" + name;
      layer.linear = linear;
      layer.n = linear->out;
      layer.k = linear->in;
      layer.compute = linear->compute_dtype() == DType::bf16 ? g::Element::bf16 : g::Element::f32;
      layer.layout = g::packed_layout(layer.n, layer.k, layer.compute, isa, model.threads);
      layers.push_back(std::move(layer));
    }
  // The weights as loaded are what the panels are made from: their hashes are the model's checksum.
  tbb::parallel_for(std::size_t{0}, layers.size(), [&](std::size_t i) {
    const Tensor w = layers[i].linear->weight.contiguous();
    layers[i].weight_hash = content_hash(w.data_ptr(), w.nbytes());
  });
  return layers;
}

uint64_t model_checksum(const std::vector<CachedLayer>& layers) {
  std::string text;
  for (const CachedLayer& l : layers) text += l.key + '\0' + hash_hex(l.weight_hash) + '\0';
  return content_hash(text.data(), text.size());
}

std::string isa_text() { return std::string(g::isa_name(g::best_isa())); }

nlohmann::ordered_json header_json(const PackedCacheModel& model, const std::vector<CachedLayer>& layers, uint64_t checksum) {
  nlohmann::ordered_json records = nlohmann::ordered_json::array();
  for (const CachedLayer& l : layers)
    records.push_back({{"layer", l.key},
                       {"n", l.n},
                       {"k", l.k},
                       {"compute", compute_name(l.compute)},
                       {"kernel", std::string(g::bf16_path_name(l.layout.bf16))},
                       {"kc", l.layout.kc},
                       {"panel_stride", l.layout.panel_stride},
                       {"offset", l.offset},
                       {"bytes", l.layout.bytes},
                       {"weight_hash", hash_hex(l.weight_hash)},
                       {"panel_hash", hash_hex(l.panel_hash)}});
  return {{"format", kFormatName},      {"version", kFormatVersion}, {"model", model.name},      {"model_checksum", hash_hex(checksum)},
          {"cpu", g::cpu_model_name()}, {"isa", isa_text()},         {"threads", model.threads}, {"layers", std::move(records)}};
}

// Lays the layers out after a header of the size their own offsets give it; returns the header.
std::string lay_out(const PackedCacheModel& model, std::vector<CachedLayer>& layers, uint64_t checksum) {
  uint64_t data_start = kAlign;
  for (;;) {
    uint64_t at = data_start;
    for (CachedLayer& l : layers) l.offset = at, at = round_up(at + l.layout.bytes, kAlign);
    std::string header = dump_json(header_json(model, layers, checksum));
    const uint64_t needed = round_up(kPreamble + header.size(), kAlign);
    if (needed <= data_start) return header;
    data_start = needed;
  }
}

// --- reading ----------------------------------------------------------------------------------

struct FileLayer {
  std::string key, compute, kernel, weight_hash, panel_hash;
  int64_t n = 0, k = 0, kc = 0, panel_stride = 0;
  uint64_t offset = 0, bytes = 0;
};

struct CacheFile {
  std::shared_ptr<const MappedFile> mapping;
  int version = 0;
  std::string cpu, isa, model_checksum;
  int threads = 0;
  std::vector<FileLayer> layers;
};

[[noreturn]] void damaged(const std::string& path, const std::string& what) {
  throw Error("--packed-cache file " + path + " is damaged: " + what + " (delete it and cubevec packs and writes it again)");
}

// Text from the file, fit for a one-line note: printable ASCII only (control characters, and bytes
// of other characters, become '?'), at most `limit` characters.
std::string printable(const std::string& text, std::size_t limit = 80) {
  std::string out;
  for (char c : text.substr(0, limit)) out += c >= 0x20 && c < 0x7f ? c : '?';
  return text.size() > limit ? out + "..." : out;
}

const nlohmann::json& member(const nlohmann::json& object, const char* name, const std::string& path, const std::string& where) {
  const auto it = object.find(name);
  if (it == object.end()) damaged(path, where + " has no \"" + name + "\"");
  return *it;
}

std::string text_field(const nlohmann::json& object, const char* name, const std::string& path, const std::string& where,
                       std::size_t max_size = 4096) {
  const nlohmann::json& v = member(object, name, path, where);
  if (!v.is_string()) damaged(path, where + "'s \"" + name + "\" is not a string");
  const std::string text = v.get<std::string>();
  if (text.empty() || text.size() > max_size)
    damaged(path,
            where + "'s \"" + name + "\" is " + std::to_string(text.size()) + " characters (expected 1.." + std::to_string(max_size) + ")");
  return text;
}

// A JSON integer (not 1.5, 1.0, 1e0 or true) in [lo, hi].
template <class T>
T integer_field(const nlohmann::json& object, const char* name, const std::string& path, const std::string& where, T lo, T hi) {
  const nlohmann::json& v = member(object, name, path, where);
  const bool fits = v.is_number_unsigned()
                        ? v.get<uint64_t>() <= static_cast<uint64_t>(hi) && static_cast<uint64_t>(lo) <= v.get<uint64_t>()
                    : v.is_number_integer() ? v.get<int64_t>() >= static_cast<int64_t>(lo) && v.get<int64_t>() <= static_cast<int64_t>(hi)
                                            : false;
  if (!fits)
    damaged(path, where + "'s \"" + name + "\" is " + printable(v.dump()) + " (expected an integer in " + std::to_string(lo) + ".." +
                      std::to_string(hi) + ")");
  return v.get<T>();
}

std::string hash_field(const nlohmann::json& object, const char* name, const std::string& path, const std::string& where) {
  const std::string text = text_field(object, name, path, where, 16);
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
    damaged(path, where + "'s \"" + name + "\" is not 16 hex digits");
  return text;
}

CacheFile read_cache_file(const std::string& path) {
  CacheFile file;
  try {
    file.mapping = MappedFile::open(path);
  } catch (const Error& e) {
    throw Error(std::string("--packed-cache file ") + e.what());
  }
  const std::span<const std::byte> bytes = file.mapping->bytes();
  if (bytes.size() < kPreamble || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    damaged(path, "it does not start with cubevec's packed-panel magic");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data() + sizeof kMagic, sizeof header_bytes);
  if (header_bytes > kMaxHeaderBytes)
    damaged(path, "its header length is " + std::to_string(header_bytes) + " bytes (at most " + std::to_string(kMaxHeaderBytes) + ")");
  if (header_bytes > bytes.size() - kPreamble)
    damaged(path, "its header length (" + std::to_string(header_bytes) + " bytes) runs past the file's end (" +
                      std::to_string(bytes.size()) + " bytes)");
  const char* header_text = reinterpret_cast<const char*>(bytes.data()) + kPreamble;
  // A NUL would end the JSON early: a header length that takes in the padding is wrong.
  if (std::memchr(header_text, 0, header_bytes)) damaged(path, "its header holds a NUL byte (its recorded length is wrong)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text, header_text + header_bytes);
  } catch (const nlohmann::json::exception& e) {
    damaged(path, "its header is not JSON: " + printable(e.what(), 200));
  }
  if (!header.is_object()) damaged(path, "its header is not a JSON object");
  if (text_field(header, "format", path, "the header") != kFormatName) damaged(path, "its header names another format");
  file.version = integer_field<int>(header, "version", path, "the header", 0, 1 << 20);
  if (file.version != kFormatVersion) return file;  // another cubevec's file: replaced, not read further
  text_field(header, "model", path, "the header");  // for people: the file name is what matches it
  file.cpu = text_field(header, "cpu", path, "the header");
  file.isa = text_field(header, "isa", path, "the header");
  file.model_checksum = hash_field(header, "model_checksum", path, "the header");
  file.threads = integer_field<int>(header, "threads", path, "the header", 1, 1 << 20);
  const auto layers = header.find("layers");
  if (layers == header.end() || !layers->is_array()) damaged(path, "its header has no \"layers\" list");
  uint64_t previous_end = kPreamble + header_bytes;
  constexpr int64_t kMaxDim = int64_t{1} << 40;
  for (const nlohmann::json& record : *layers) {
    const std::string position = "layer record " + std::to_string(file.layers.size());
    if (!record.is_object()) damaged(path, position + " is not a JSON object");
    FileLayer l;
    l.key = text_field(record, "layer", path, position);
    const std::string where = position + " (" + printable(l.key) + ")";
    l.n = integer_field<int64_t>(record, "n", path, where, 1, kMaxDim);
    l.k = integer_field<int64_t>(record, "k", path, where, 1, kMaxDim);
    l.compute = text_field(record, "compute", path, where);
    if (l.compute != "f32" && l.compute != "bf16") damaged(path, where + "'s \"compute\" is not f32 or bf16");
    l.kernel = text_field(record, "kernel", path, where);
    if (!g::parse_bf16_path(l.kernel)) damaged(path, where + "'s \"kernel\" is not amx, avx512bf16 or f32");
    l.kc = integer_field<int64_t>(record, "kc", path, where, 1, kMaxDim);
    l.panel_stride = integer_field<int64_t>(record, "panel_stride", path, where, 1, kMaxDim);
    l.offset = integer_field<uint64_t>(record, "offset", path, where, 0, uint64_t{1} << 62);
    l.bytes = integer_field<uint64_t>(record, "bytes", path, where, 1, uint64_t{1} << 62);
    l.weight_hash = hash_field(record, "weight_hash", path, where);
    l.panel_hash = hash_field(record, "panel_hash", path, where);
    // The layout must be one some kernel makes: every K block a whole panel stride of N columns.
    const int64_t blocks = std::max<int64_t>((l.k + l.kc - 1) / l.kc, 1);
    const uint64_t element = l.kernel == "f32" ? 4 : 2;
    if (l.panel_stride < l.n * std::min(l.kc, l.k) || l.panel_stride % l.kc != 0 ||
        l.bytes != static_cast<uint64_t>(blocks) * static_cast<uint64_t>(l.panel_stride) * element)
      damaged(path, where + "'s layout is impossible (KC " + std::to_string(l.kc) + ", panel stride " + std::to_string(l.panel_stride) +
                        ", " + std::to_string(l.bytes) + " bytes for " + std::to_string(l.n) + " x " + std::to_string(l.k) + ")");
    if (l.offset % kAlign != 0 || l.offset < previous_end)
      damaged(path, where + "'s offset " + std::to_string(l.offset) + " is not a page-aligned place after the previous data");
    if (l.bytes > bytes.size() || l.offset > bytes.size() - l.bytes)
      damaged(path, where + "'s panels (" + std::to_string(l.bytes) + " bytes at " + std::to_string(l.offset) +
                        ") run past the file's end (" + std::to_string(bytes.size()) + " bytes: truncated?)");
    previous_end = l.offset + l.bytes;
    file.layers.push_back(std::move(l));
  }
  return file;
}

std::string layout_text(const std::string& kernel, int64_t kc, int64_t stride, uint64_t bytes) {
  return kernel + " panels (KC " + std::to_string(kc) + ", panel stride " + std::to_string(stride) + ", " + std::to_string(bytes) +
         " bytes)";
}

// Why `file` cannot serve `layers` on this machine ("" when it can). Compared in the order a
// user can act on: the CPU, the weights, then the kernel choices.
std::string why_unusable(const CacheFile& file, const std::vector<CachedLayer>& layers, uint64_t checksum, const PackedCacheModel& model) {
  if (file.version != kFormatVersion)
    return "another version of cubevec (format version " + std::to_string(file.version) + "; this one reads " +
           std::to_string(kFormatVersion) + ")";
  if (file.cpu != g::cpu_model_name() || file.isa != isa_text())
    return "another CPU (" + printable(file.cpu) + ", " + printable(file.isa) + "; this one is " + g::cpu_model_name() + ", " + isa_text() +
           ")";
  if (file.layers.size() != layers.size()) {
    return "another set of layers (" + std::to_string(file.layers.size()) + " in the file, " + std::to_string(layers.size()) +
           " float Linears here: another quantization or model)";
  }
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const FileLayer& f = file.layers[i];
    const CachedLayer& l = layers[i];
    if (f.key != l.key)
      return "another model (layer " + std::to_string(i) + " is " + printable(f.key) + " in the file, " + l.key + " here)";
    if (f.n != l.n || f.k != l.k || f.compute != compute_name(l.compute))
      return "another model or dtype (" + l.key + " is " + std::to_string(f.n) + " x " + std::to_string(f.k) + " " + f.compute +
             " in the file, " + std::to_string(l.n) + " x " + std::to_string(l.k) + " " + compute_name(l.compute) + " here)";
    if (f.weight_hash != hash_hex(l.weight_hash)) return "other weights (" + l.key + " changed since the file was written)";
  }
  if (file.model_checksum != hash_hex(checksum)) return "other weights (the model checksum differs)";
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const FileLayer& f = file.layers[i];
    const CachedLayer& l = layers[i];
    if (f.kernel != g::bf16_path_name(l.layout.bf16) || f.kc != l.layout.kc || f.panel_stride != l.layout.panel_stride ||
        f.bytes != l.layout.bytes)
      return "other kernel choices (" + l.key + ": " + layout_text(f.kernel, f.kc, f.panel_stride, f.bytes) + " in the file, " +
             layout_text(std::string(g::bf16_path_name(l.layout.bf16)), l.layout.kc, l.layout.panel_stride, l.layout.bytes) +
             " chosen now for " + std::to_string(model.threads) + " Cube thread" + (model.threads == 1 ? "" : "s") + ")";
  }
  return "";
}

// The hash a layer's panels are recorded with: seeded with the layer's name and weight, so panels
// moved to another layer (with their hash) do not pass.
uint64_t panel_hash_of(const void* data, std::size_t bytes, const std::string& key, const std::string& weight_hash) {
  const std::string seed = key + '\0' + weight_hash;
  return content_hash(data, bytes, content_hash(seed.data(), seed.size()));
}

// Checks every layer's panels against their recorded hash, then lends them to the Linears.
void adopt(const std::string& path, const CacheFile& file, const std::vector<CachedLayer>& layers) {
  const std::byte* base = file.mapping->bytes().data();
  std::vector<std::string> bad(layers.size());
  tbb::parallel_for(std::size_t{0}, layers.size(), [&](std::size_t i) {
    const FileLayer& f = file.layers[i];
    if (hash_hex(panel_hash_of(base + f.offset, f.bytes, f.key, f.weight_hash)) != f.panel_hash) bad[i] = f.key;
  });
  for (const std::string& key : bad)
    if (!key.empty()) damaged(path, "the panels of " + printable(key) + " do not match their recorded hash");
  const g::Isa isa = g::best_isa();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const CachedLayer& l = layers[i];
    l.linear->adopt_packed(g::adopt_packed_b(l.n, l.k, l.compute, isa, l.layout, base + file.layers[i].offset, file.mapping));
    // The panels are all the GEMM reads: the weight's mapped pages (read for its hash) can go.
    l.linear->release_weight_pages();
  }
}

void write_cache_file(const std::string& path, const PackedCacheModel& model, std::vector<CachedLayer>& layers, uint64_t checksum) {
  const std::string header = lay_out(model, layers, checksum);
  OutputFile out(path, "--packed-cache file");
  const auto pad_to = [&](uint64_t offset) {
    static const std::vector<char> zeros(kAlign, 0);
    while (out.size() < offset) out.write(zeros.data(), static_cast<std::size_t>(std::min<uint64_t>(offset - out.size(), kAlign)));
  };
  const uint64_t header_bytes = header.size();
  out.write(kMagic, sizeof kMagic);
  out.write(&header_bytes, sizeof header_bytes);
  out.write(header);  // its panel hashes are placeholders until every layer is written
  for (CachedLayer& l : layers) {
    pad_to(l.offset);
    // One layer packed at a time and let go once written: the peak is one layer's panels.
    const auto panels = l.linear->packed_panels(model.threads);
    if (panels->bf16 != l.layout.bf16 || panels->bytes() != l.layout.bytes)
      throw Error("--packed-cache: " + l.key + " packed to another layout than planned (an internal error)");
    l.panel_hash = panel_hash_of(panels->data(), panels->bytes(), l.key, hash_hex(l.weight_hash));
    out.write(panels->data(), panels->bytes());
    l.linear->release_packed();
  }
  const std::string final_header = dump_json(header_json(model, layers, checksum));
  if (final_header.size() != header.size()) throw Error("--packed-cache: the header changed size while writing (an internal error)");
  out.write_at(kPreamble, final_header.data(), final_header.size());
  out.commit_now();
  // Read-only: a mapped file must be replaced (written beside, renamed over), never overwritten in
  // place, which would change or cut the pages running processes compute with.
  std::error_code ignored;
  std::filesystem::permissions(
      path, std::filesystem::perms::owner_write | std::filesystem::perms::group_write | std::filesystem::perms::others_write,
      std::filesystem::perm_options::remove, ignored);
}

std::string file_name_part(const std::string& name) {
  std::string out;
  for (char c : name) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return out.empty() || out[0] == '.' ? "model" + out : out;
}

double elapsed_seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

nlohmann::ordered_json PackedCacheResult::json() const {
  nlohmann::ordered_json j = {{"file", file}, {"state", state}};
  if (!ignored.empty()) j["ignored"] = ignored;
  j["layers"] = layers;
  j["bytes"] = bytes;
  j["packed"] = packed;
  j["seconds"] = seconds;
  return j;
}

std::string packed_cache_path(const std::string& dir, const PackedCacheModel& model) {
  const uint64_t identity = content_hash(model.identity.data(), model.identity.size());
  return dir + "/" + file_name_part(model.name) + "-" + hash_hex(identity).substr(0, 8) + ".cvpack";
}

PackedCacheResult use_packed_cache(const std::string& dir, const PackedCacheModel& model) {
  const auto t0 = std::chrono::steady_clock::now();
  if (dir.empty()) throw Error("--packed-cache: expected a folder, got an empty path");
  if (!folder_exists(dir, " (--packed-cache names the folder the packed panels go in)")) {
    std::error_code error;
    if (std::filesystem::is_symlink(std::filesystem::symlink_status(dir, error)))
      throw Error("--packed-cache " + dir + " is a symbolic link to " + std::filesystem::read_symlink(dir, error).string() +
                  ", which does not exist");
    if (!std::filesystem::create_directory(dir, error) && !folder_exists(dir))
      throw Error("--packed-cache " + dir + ": the folder does not exist and cannot be created: " + error.message());
  }
  PackedCacheResult result;
  result.file = packed_cache_path(dir, model);
  std::vector<CachedLayer> layers = layers_of(model);
  const uint64_t checksum = model_checksum(layers);
  const uint64_t packed_before = g::packed_b_count();

  std::error_code exists_error;
  if (std::filesystem::exists(std::filesystem::symlink_status(result.file, exists_error))) {
    CacheFile file = read_cache_file(result.file);
    result.ignored = why_unusable(file, layers, checksum, model);
    if (result.ignored.empty()) {
      adopt(result.file, file, layers);
      result.state = "mapped";
    } else {
      // Our own file, kept read-only: writable again so that the new one may be renamed over it.
      std::error_code ignored;
      std::filesystem::permissions(result.file, std::filesystem::perms::owner_write, std::filesystem::perm_options::add, ignored);
    }
  }
  if (result.state.empty()) {
    try {
      write_cache_file(result.file, model, layers, checksum);
    } catch (const Error&) {
      // Processes loading the same model at once race to write its file: the first to finish
      // renames it into place (read-only), and the others, finding it there, map that one.
      std::error_code error;
      if (result.ignored.empty() && std::filesystem::exists(std::filesystem::symlink_status(result.file, error))) {
        CacheFile file = read_cache_file(result.file);
        if (why_unusable(file, layers, checksum, model).empty()) {
          adopt(result.file, file, layers);
          result.state = "mapped";
        }
      }
      if (result.state.empty()) throw;
    }
  }
  if (result.state.empty()) {
    // Read back like any later process would: the panels used are the file's, shared.
    CacheFile file = read_cache_file(result.file);
    if (const std::string problem = why_unusable(file, layers, checksum, model); !problem.empty())
      throw Error("--packed-cache file " + result.file + " changed while it was written (another process wrote " + problem + ")");
    adopt(result.file, file, layers);
    result.state = "written";
  }
  result.layers = static_cast<int>(layers.size());
  for (const CachedLayer& l : layers) result.bytes += l.layout.bytes;
  result.packed = g::packed_b_count() - packed_before;
  result.seconds = elapsed_seconds(t0);
  return result;
}

}  // namespace cubevec::models
