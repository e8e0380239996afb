#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ops/attention_tuner.h"
#include "ops/gemm/driver.h"
#include "base/config_reader.h"
#include "base/enum_names.h"
#include "base/output_file.h"
#include "base/regular_file.h"
#include "base/strict_json.h"

namespace cubevec::ops {

namespace {

constexpr const char* kFormat = "cubevec-attention-tune-cache";
constexpr int kVersion = 1;

using nlohmann::json;

// Attention over no heads, rows or channels is never tuned: such an entry is damage, not a pick.
int64_t positive_field(const json& entry, const char* name) {
  if (!entry.contains(name) || !is_int64(entry[name]) || entry[name].get<int64_t>() < 1)
    throw Error(std::string("field '") + name + "' must be a positive integer below 2^63" +
                (entry.contains(name) ? ", got " + json_for_message(entry[name]) : std::string()));
  return entry[name].get<int64_t>();
}

// Entries of one fingerprint with the same key would leave the pick to their order in the file;
// cubevec never writes two, so a repeated key is damage too. Throws naming both entries.
template <class Entries>
void refuse_repeated_key(const Entries& loaded, const AttentionTuneKey& key, std::size_t index, const char* what) {
  for (const auto& [other, at] : loaded)
    if (other.first == key)
      throw Error(std::string(what) + " " + std::to_string(index) + " repeats the key of " + what + " " + std::to_string(at) + " (" +
                  key.text() + ")");
}

std::string string_field(const json& entry, const char* name) {
  if (!entry.contains(name) || !entry[name].is_string()) throw Error(std::string("field '") + name + "' must be a string");
  return entry[name].get<std::string>();
}

}  // namespace

namespace {
constexpr auto kMaskKindNames = enum_names<AttentionMaskKind>("mask kind", {{AttentionMaskKind::none, "none"},
                                                                            {AttentionMaskKind::mask_2d, "2d"},
                                                                            {AttentionMaskKind::mask_4d, "4d"},
                                                                            {AttentionMaskKind::block_sparse, "block"},
                                                                            {AttentionMaskKind::bias_2d, "bias2d"},
                                                                            {AttentionMaskKind::bias_4d, "bias4d"}});
AttentionMaskKind parse_mask_kind(std::string_view name) { return kMaskKindNames.parse(name); }
}  // namespace

std::string_view attention_mask_kind_name(AttentionMaskKind kind) { return kMaskKindNames.name(kind); }

namespace {

std::pair<AttentionTuneKey, AttentionTuneChoice> entry_from_json(const json& e) {
  if (!e.is_object()) throw Error("must be an object");
  AttentionTuneKey key;
  key.batch = positive_field(e, "batch");
  key.heads = positive_field(e, "heads");
  key.head_dim = positive_field(e, "head_dim");
  key.q_len = positive_field(e, "q_len");
  key.kv_len = positive_field(e, "kv_len");
  key.dtype = parse_dtype(string_field(e, "dtype"));
  if (key.dtype != DType::f32 && key.dtype != DType::bf16) throw Error("field 'dtype' must be f32 or bf16");
  key.layout = parse_attention_layout(string_field(e, "layout"));
  key.mask = parse_mask_kind(string_field(e, "mask"));
  AttentionTuneChoice choice;
  choice.op_type = parse_attention_impl(string_field(e, "op_type"));
  // The tuner chooses among exact kernels only: a lossy one is asked for by name, never cached.
  if (choice.op_type == AttentionImpl::flash_int8) throw Error("field 'op_type' flash_int8 is lossy and never a tuned choice");
  choice.kernel_layout = parse_attention_layout(string_field(e, "kernel_layout"));
  if (choice.kernel_layout == AttentionLayout::bsh) throw Error("field 'kernel_layout' must be BSND or BNSD");
  if (!e.contains("seconds") || !e["seconds"].is_number() || !(e["seconds"].get<double>() >= 0))
    throw Error("field 'seconds' must be a non-negative number");
  choice.seconds = e["seconds"].get<double>();
  return {key, choice};
}

json entry_to_json(const AttentionTuneKey& k, const AttentionTuneChoice& c) {
  return {{"batch", k.batch},
          {"heads", k.heads},
          {"head_dim", k.head_dim},
          {"q_len", k.q_len},
          {"kv_len", k.kv_len},
          {"dtype", std::string(dtype_name(k.dtype))},
          {"layout", std::string(attention_layout_name(k.layout))},
          {"mask", std::string(attention_mask_kind_name(k.mask))},
          {"op_type", std::string(attention_impl_name(c.op_type))},
          {"kernel_layout", std::string(attention_layout_name(c.kernel_layout))},
          {"seconds", c.seconds}};
}

}  // namespace

std::string AttentionTuneKey::text() const {
  std::ostringstream s;
  s << "B" << batch << " N" << heads << " D" << head_dim << " Sq" << q_len << " Sk" << kv_len << " " << dtype_name(dtype) << " "
    << attention_layout_name(layout) << " mask " << attention_mask_kind_name(mask);
  return s.str();
}

AttentionTuner& AttentionTuner::global() {
  // Leaked on purpose, as GemmTuner::global(): kernels may still run during static destruction.
  static AttentionTuner* tuner = new AttentionTuner();
  return *tuner;
}

std::optional<AttentionTuneChoice> AttentionTuner::find(const AttentionTuneKey& key) const {
  std::lock_guard lock(mutex_);
  for (const auto& [k, choice] : entries_)
    if (k == key) return choice;
  return std::nullopt;
}

void AttentionTuner::store(const AttentionTuneKey& key, const AttentionTuneChoice& choice) { store_entry(key, choice, true); }

void AttentionTuner::store_entry(const AttentionTuneKey& key, const AttentionTuneChoice& choice, bool is_change) {
  std::lock_guard lock(mutex_);
  for (auto& [k, c] : entries_)
    if (k == key) {
      changed_ = changed_ ||
                 (is_change && (c.op_type != choice.op_type || c.kernel_layout != choice.kernel_layout || c.seconds != choice.seconds));
      c = choice;
      return;
    }
  if (entries_.size() >= kMaxEntries) entries_.erase(entries_.begin());
  entries_.emplace_back(key, choice);
  changed_ = changed_ || is_change;
}

bool AttentionTuner::changed() const {
  std::lock_guard lock(mutex_);
  return changed_;
}

std::vector<std::pair<AttentionTuneKey, AttentionTuneChoice>> AttentionTuner::entries() const {
  std::lock_guard lock(mutex_);
  return entries_;
}

void AttentionTuner::clear() {
  std::lock_guard lock(mutex_);
  entries_.clear();
}

std::string AttentionTuner::load(const std::string& path, const std::string& fingerprint) {
  if (!std::filesystem::exists(path)) return "attention tune cache " + path + " does not exist yet; it will be written after tuning";
  std::string text;
  try {
    text = read_regular_file(path);
  } catch (const Error& e) {
    throw Error("attention tune cache " + std::string(e.what()));
  }
  std::vector<std::pair<AttentionTuneKey, AttentionTuneChoice>> loaded;
  try {
    const json doc = parse_strict_json(text, 8);
    if (!doc.is_object()) throw Error("expected a JSON object at the top level");
    if (!doc.contains("format") || doc["format"] != kFormat) throw Error(std::string("field 'format' must be \"") + kFormat + "\"");
    if (!doc.contains("version") || !doc["version"].is_number_integer()) throw Error("field 'version' must be an integer");
    if (doc["version"].get<int64_t>() != kVersion)
      return "attention tune cache " + path + " has format version " + doc["version"].dump() + ", this cubevec writes " +
             std::to_string(kVersion) + "; ignoring it (it will be rewritten)";
    const std::string file_fingerprint = string_field(doc, "fingerprint");
    if (!doc.contains("entries") || !doc["entries"].is_array()) throw Error("field 'entries' must be an array");
    std::vector<std::pair<std::pair<AttentionTuneKey, AttentionTuneChoice>, std::size_t>> indexed;
    std::size_t index = 0;
    for (const json& e : doc["entries"]) {
      std::pair<AttentionTuneKey, AttentionTuneChoice> entry;
      try {
        entry = entry_from_json(e);
      } catch (const Error& err) {
        throw Error("entry " + std::to_string(index) + ": " + err.what());
      }
      refuse_repeated_key(indexed, entry.first, index, "entry");
      indexed.push_back({entry, index});
      loaded.push_back(entry);
      ++index;
    }
    if (file_fingerprint != fingerprint)
      return "attention tune cache " + path + " is stale: tuned for '" + file_fingerprint + "', this run is '" + fingerprint +
             "'; ignoring its " + std::to_string(loaded.size()) + " entries (they will be rewritten)";
  } catch (const Error& err) {
    throw Error("attention tune cache " + path + " is not valid: " + err.what() + " (delete it to tune again)");
  }
  for (const auto& [key, choice] : loaded) store(key, choice);
  std::lock_guard lock(mutex_);
  changed_ = false;  // what is in memory is what the file holds
  return "";
}

void AttentionTuner::save(const std::string& path, const std::string& fingerprint) const {
  // Picks timed while flash_bf16's tiles ran on the AMX tile model would mislead every later run.
  if (gemm::amx_model_on()) return;
  json entries = json::array();
  for (const auto& [k, c] : this->entries()) entries.push_back(entry_to_json(k, c));
  const json doc = {{"format", kFormat}, {"version", kVersion}, {"fingerprint", fingerprint}, {"entries", entries}};
  write_output_file(path, "attention tune cache", doc.dump(1) + "\n");
  std::lock_guard lock(mutex_);
  changed_ = false;
}

void AttentionTuner::set_picks_file(std::shared_ptr<AttentionPicksFile> file) {
  std::lock_guard lock(mutex_);
  picks_file_ = std::move(file);
}

std::shared_ptr<AttentionPicksFile> AttentionTuner::picks_file() const {
  std::lock_guard lock(mutex_);
  return picks_file_;
}

std::size_t AttentionTuner::add_section(const json& section, const std::string& fingerprint, json& foreign, bool only_missing) {
  if (!section.is_array()) throw Error("field 'attention' must be an array");
  std::vector<std::pair<std::pair<AttentionTuneKey, AttentionTuneChoice>, std::size_t>> loaded;
  foreign = json::array();
  for (std::size_t index = 0; index < section.size(); ++index) {
    std::string entry_fingerprint;
    std::pair<AttentionTuneKey, AttentionTuneChoice> entry;
    try {
      entry_fingerprint = string_field(section[index], "fingerprint");
      entry = entry_from_json(section[index]);
    } catch (const Error& err) {
      throw Error("attention entry " + std::to_string(index) + ": " + err.what());
    }
    if (entry_fingerprint != fingerprint) {
      foreign.push_back(section[index]);
      continue;
    }
    refuse_repeated_key(loaded, entry.first, index, "attention entry");
    loaded.push_back({entry, index});
  }
  if (only_missing) {
    for (const auto& [entry, index] : loaded)
      if (!find(entry.first)) store_entry(entry.first, entry.second, false);  // as the file has it: not a change to save
    return foreign.size();
  }
  for (const auto& [entry, index] : loaded) store(entry.first, entry.second);
  std::lock_guard lock(mutex_);
  changed_ = false;
  return foreign.size();
}

json AttentionTuner::with_entries(json out, const std::string& fingerprint, const std::vector<AttentionTuneKey>& skip) const {
  for (const auto& [k, c] : entries()) {
    if (std::find(skip.begin(), skip.end(), k) != skip.end()) continue;
    json e = entry_to_json(k, c);
    e["fingerprint"] = fingerprint;
    out.push_back(e);
  }
  std::lock_guard lock(mutex_);
  changed_ = false;
  return out;
}

json AttentionTuner::section(const std::string& fingerprint, const json& foreign) const {
  return with_entries(foreign.is_array() ? foreign : json::array(), fingerprint, {});
}

json AttentionTuner::merged_section(const json& current, const std::string& fingerprint, const json& foreign) const {
  if (current.is_null()) return section(fingerprint, foreign);
  if (!current.is_array()) throw Error("field 'attention' must be an array");
  std::vector<AttentionTuneKey> in_file;  // the file's keys under `fingerprint`: the file's picks stay
  for (std::size_t index = 0; index < current.size(); ++index) {
    try {
      if (string_field(current[index], "fingerprint") == fingerprint) in_file.push_back(entry_from_json(current[index]).first);
    } catch (const Error& err) {
      throw Error("attention entry " + std::to_string(index) + ": " + err.what());
    }
  }
  return with_entries(current, fingerprint, in_file);
}

std::string attention_tune_fingerprint(const Device& device) {
  return std::string("isa=") + std::string(isa_name(gemm::best_isa())) + " cube_threads=" + std::to_string(device.profile().cube_threads) +
         " vector_threads=" + std::to_string(device.profile().vector_threads);
}

}  // namespace cubevec::ops
