// The GEMM tuning file and its in-memory table (GemmTuner): entries read, checked, merged and
// saved; the calibration that measures them is ops/gemm/calibration.cpp.
#include "ops/gemm/tuner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "base/enum_names.h"
#include "base/error.h"
#include "base/output_file.h"
#include "base/regular_file.h"
#include "base/strict_json.h"

namespace cubevec::ops::gemm {

namespace {

using json = nlohmann::json;

constexpr auto kFamilyNames =
    enum_names<GemmFamily>("GEMM family", {{GemmFamily::f32, "f32"}, {GemmFamily::bf16, "bf16"}, {GemmFamily::int8, "int8"}});
constexpr auto kShapeNames =
    enum_names<ShapeClass>("shape class", {{ShapeClass::skinny, "skinny"}, {ShapeClass::small, "small"}, {ShapeClass::large, "large"}});
constexpr auto kIsaNames = enum_names<Isa>("ISA", {{Isa::avx512, "avx512"}, {Isa::avx2, "avx2"}, {Isa::portable, "portable"}});
constexpr const char* kFormat = "cubevec-tuning";
constexpr int kVersion = 1;

std::string field_text(const json& object, const char* name) {
  if (!object.contains(name) || !object[name].is_string()) throw Error(std::string("field '") + name + "' must be a string");
  return object[name].get<std::string>();
}

int64_t field_int(const json& object, const char* name, int64_t lo, int64_t hi) {
  if (!object.contains(name) || !object[name].is_number_integer()) throw Error(std::string("field '") + name + "' must be an integer");
  const json& value = object[name];
  if (!is_int64(value) || value.get<int64_t>() < lo || value.get<int64_t>() > hi)
    throw Error(std::string("field '") + name + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                value.dump());
  return value.get<int64_t>();
}

json variant_json(const GemmVariant& v) {
  return {{"kernel", std::string(v.kernel_name())}, {"l2_share", v.l2_share}, {"prefetch", v.prefetch}};
}

// The kernel names of the two kinds overlap ("amx" is both), so the entry's family says which.
GemmVariant parse_variant(const json& object, GemmFamily family) {
  if (!object.is_object()) throw Error("a variant must be an object");
  GemmVariant v;
  const std::string kernel = field_text(object, "kernel");
  if (family == GemmFamily::int8) {
    const auto int8 = parse_int8_isa(kernel);
    if (!int8) throw Error("unknown int8 kernel '" + kernel + "' (expected amx, avx512_vnni, avx_vnni, avx2 or portable)");
    v.int8 = *int8;
  } else {
    const auto path = parse_bf16_path(kernel);
    if (!path)
      throw Error("unknown " + std::string(kFamilyNames.name(family)) + " kernel '" + kernel + "' (expected amx, avx512bf16 or f32)");
    v.bf16 = *path;
  }
  v.l2_share = static_cast<int>(field_int(object, "l2_share", 1, 64));
  if (!object.contains("prefetch") || !object["prefetch"].is_boolean()) throw Error("field 'prefetch' must be true or false");
  v.prefetch = object["prefetch"].get<bool>();
  return v;
}

json caches_json(const CpuCaches& caches) { return {{"l1d", caches.l1d}, {"l2", caches.l2}, {"l3", caches.l3}}; }

// A tuning file that exists but cannot be read now (no descriptors left, no permission): not a
// damaged file, so the messages do not suggest deleting it.
struct UnreadableTuningFile : Error {
  using Error::Error;
};

// The tuning file at `path` parsed, its format and version fields checked (any version); throws
// Error with the reason otherwise (UnreadableTuningFile when it could not be read).
json parse_tuning_document(const std::string& path) {
  std::string text;
  try {
    text = read_regular_file(path);
  } catch (const Error& err) {
    throw UnreadableTuningFile(err.what());
  }
  json doc = parse_strict_json(text, 8);
  if (!doc.is_object()) throw Error("expected a JSON object at the top level");
  if (!doc.contains("format") || doc["format"] != kFormat) throw Error(std::string("field 'format' must be \"") + kFormat + "\"");
  if (!doc.contains("version") || !doc["version"].is_number_integer()) throw Error("field 'version' must be an integer");
  return doc;
}

std::string invalid_file_message(const std::string& path, const Error& err) {
  if (dynamic_cast<const UnreadableTuningFile*>(&err)) return "tuning file " + path + " cannot be used: " + err.what();
  return "tuning file " + path + " is not valid: " + err.what() +
         " (if it is a damaged tuning file, delete it to measure again; otherwise name another file)";
}

// The file's document, or null when it does not exist. A file of another format version (another
// cubevec's, perhaps written since this process read it) is an Error: it is never replaced.
json read_tuning_document(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return nullptr;
  json doc;
  try {
    doc = parse_tuning_document(path);
  } catch (const Error& err) {
    throw Error(invalid_file_message(path, err));
  }
  if (doc["version"].get<int64_t>() != kVersion)
    throw Error("tuning file " + path + " has format version " + doc["version"].dump() + ", this cubevec reads and writes " +
                std::to_string(kVersion) + "; it is left as it is");
  return doc;
}

std::string default_tuning_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg == '/') return std::string(xdg) + "/cubevec/tuning.json";
  const char* home = std::getenv("HOME");
  if (home && *home == '/') return std::string(home) + "/.cache/cubevec/tuning.json";
  return "";
}

}  // namespace

std::string_view gemm_family_name(GemmFamily family) { return kFamilyNames.name(family); }
std::string_view shape_class_name(ShapeClass shape) { return kShapeNames.name(shape); }

ShapeClass shape_class_of(int64_t m) { return m < 256 ? ShapeClass::skinny : m <= 1024 ? ShapeClass::small : ShapeClass::large; }

std::string GemmTuneKey::text() const {
  return std::string(gemm_family_name(family)) + " " + std::string(isa_name(isa)) + " " + std::string(shape_class_name(shape)) + " " +
         std::to_string(threads) + (threads == 1 ? " thread" : " threads");
}

std::string_view GemmVariant::kernel_name() const { return int8 ? int8_isa_name(*int8) : bf16_path_name(bf16); }

std::string GemmVariant::name() const {
  return std::string(kernel_name()) + " L2/" + std::to_string(l2_share) + (prefetch ? " prefetch" : "");
}

json gemm_entry_json(const GemmTuneEntry& entry, const std::string& cpu, const CpuCaches& caches) {
  json considered = json::array();
  for (const VariantRate& r : entry.considered) {
    json v = variant_json(r.variant);
    v["gflops"] = std::round(r.gflops * 10) / 10;
    considered.push_back(v);
  }
  return {{"cpu", cpu},
          {"caches", caches_json(caches)},
          {"family", std::string(gemm_family_name(entry.key.family))},
          {"isa", std::string(isa_name(entry.key.isa))},
          {"shape", std::string(shape_class_name(entry.key.shape))},
          {"threads", entry.key.threads},
          {"choice", variant_json(entry.choice)},
          {"considered", considered}};
}

// Whether an entry's measurements cover every kernel its family would measure here today: a file
// written before cubevec had a kernel (AMX-INT8 came after VNNI) must not keep it from being tried.
bool considers_every_candidate(const GemmTuneEntry& entry) {
  if (amx_model_choice(entry.key)) return true;  // forced onto the AMX tile model: never measured, nothing missing
  for (const GemmVariant& candidate : candidate_variants(entry.key.family, entry.key.isa)) {
    bool measured = false;
    for (const VariantRate& r : entry.considered)
      measured = measured || (r.variant.int8 == candidate.int8 && r.variant.bf16 == candidate.bf16);
    if (!measured) return false;
  }
  return true;
}

ParsedGemmSection parse_gemm_section(const json& section, const std::string& cpu, const CpuCaches& caches) {
  if (!section.is_array()) throw Error("field 'gemm' must be an array");
  ParsedGemmSection out;
  std::size_t stale = 0, unavailable = 0, incomplete = 0;
  std::vector<std::pair<GemmTuneKey, std::size_t>> seen;  // this CPU's keys and where they stood
  for (std::size_t index = 0; index < section.size(); ++index) {
    const json& e = section[index];
    try {
      if (!e.is_object()) throw Error("must be an object");
      const std::string entry_cpu = field_text(e, "cpu");
      if (!e.contains("caches") || !e["caches"].is_object()) throw Error("field 'caches' must be an object");
      CpuCaches entry_caches;
      entry_caches.l1d = field_int(e["caches"], "l1d", 1, int64_t{1} << 40);
      entry_caches.l2 = field_int(e["caches"], "l2", 1, int64_t{1} << 40);
      entry_caches.l3 = field_int(e["caches"], "l3", 1, int64_t{1} << 40);
      GemmTuneEntry entry;
      entry.key.family = kFamilyNames.parse(field_text(e, "family"));
      entry.key.isa = kIsaNames.parse(field_text(e, "isa"));
      entry.key.shape = kShapeNames.parse(field_text(e, "shape"));
      entry.key.threads = static_cast<int>(field_int(e, "threads", 1, 4096));
      if (!e.contains("choice")) throw Error("field 'choice' is missing");
      entry.choice = parse_variant(e["choice"], entry.key.family);
      if (!e.contains("considered") || !e["considered"].is_array()) throw Error("field 'considered' must be an array");
      for (const json& r : e["considered"]) {
        VariantRate rate{parse_variant(r, entry.key.family), 0};
        if (!r.contains("gflops") || !r["gflops"].is_number() || !(r["gflops"].get<double>() >= 0) ||
            !std::isfinite(r["gflops"].get<double>()))
          throw Error("a considered variant's 'gflops' must be a non-negative number");
        rate.gflops = r["gflops"].get<double>();
        entry.considered.push_back(rate);
      }
      if (entry_cpu != cpu || !(entry_caches == caches)) {
        ++stale;
        out.foreign.push_back(e);
        continue;
      }
      // cubevec writes one entry per key; two would leave the choice to their order in the file.
      for (const auto& [key, at] : seen)
        if (key == entry.key) throw Error("repeats the key of gemm entry " + std::to_string(at) + " (" + key.text() + ")");
      seen.push_back({entry.key, index});
      const bool int8 = entry.key.family == GemmFamily::int8;
      if (!isa_supported(entry.key.isa) || !bf16_path_available(entry.choice.bf16) ||
          (entry.choice.int8 && !int8_isa_supported(*entry.choice.int8)) ||
          (entry.choice.prefetch && (entry.key.isa != Isa::avx512 || entry.choice.bf16 != Bf16Path::f32 || int8)) ||
          (entry.key.family == GemmFamily::f32 && entry.choice.bf16 != Bf16Path::f32)) {
        ++unavailable;  // same CPU, but this build or kernel cannot run the choice: measure again
        continue;
      }
      if (!considers_every_candidate(entry)) {
        ++incomplete;  // measured before a kernel this CPU can run existed (or while another was forced)
        out.partial.push_back(entry);
        continue;
      }
      out.entries.push_back(entry);
    } catch (const Error& err) {
      throw Error("gemm entry " + std::to_string(index) + ": " + err.what());
    }
  }
  if (stale)
    out.warnings += std::to_string(stale) + " GEMM entr" + (stale == 1 ? "y was" : "ies were") +
                    " measured on another CPU or cache configuration and " + (stale == 1 ? "is" : "are") + " ignored; ";
  if (unavailable)
    out.warnings += std::to_string(unavailable) + " GEMM entr" + (unavailable == 1 ? "y names" : "ies name") +
                    " a kernel or ISA this process cannot run and will be measured again; ";
  if (incomplete)
    out.warnings += std::to_string(incomplete) + " GEMM entr" + (incomplete == 1 ? "y has" : "ies have") +
                    " no measurement of a kernel this process weighs (one newer than the file, or one forced by "
                    "CUBEVEC_INT8_ISA or CUBEVEC_GEMM_BF16): it is measured on first use and added to " +
                    (incomplete == 1 ? "the entry's" : "the entries'") + " rates; ";
  if (!out.warnings.empty()) out.warnings.resize(out.warnings.size() - 2);
  return out;
}

Bf16Path expected_bf16_path(Isa isa, int threads) {
  if (isa != Isa::avx512) return Bf16Path::f32;
  if (const auto forced = forced_bf16_path()) return *forced;
  GemmTuner& tuner = GemmTuner::global();
  tuner.load_default_once();
  const auto entry = tuner.find({GemmFamily::bf16, isa, ShapeClass::large, std::max(threads, 1)});
  return entry ? entry->choice.bf16 : Bf16Path::f32;
}

GemmTuneEntry merge_measurements(GemmTuneEntry fresh, const GemmTuneEntry& earlier) {
  for (const VariantRate& old : earlier.considered) {
    bool measured_now = false;
    for (const VariantRate& now : fresh.considered) measured_now = measured_now || now.variant == old.variant;
    if (!measured_now) fresh.considered.push_back(old);
  }
  fresh.choice = choose_variant(fresh.considered);
  return fresh;
}

GemmTuner& GemmTuner::global() {
  // Leaked on purpose, like the default device: its unit threads may still run a GEMM (and ask the
  // tuner for a variant) while static objects are destroyed after main() returns.
  static GemmTuner* tuner = new GemmTuner();
  return *tuner;
}

std::optional<GemmTuneEntry> GemmTuner::find(const GemmTuneKey& key) const {
  std::lock_guard lock(mutex_);
  for (const auto& e : entries_)
    if (e.key == key) return e;
  return std::nullopt;
}

void GemmTuner::store(const GemmTuneEntry& entry) { store_entry(entry, true); }

void GemmTuner::store_entry(const GemmTuneEntry& entry, bool decided_here) {
  std::lock_guard lock(mutex_);
  std::erase_if(partial_entries_, [&](const GemmTuneEntry& e) { return e.key == entry.key; });  // superseded
  if (decided_here && std::find(decided_here_.begin(), decided_here_.end(), entry.key) == decided_here_.end())
    decided_here_.push_back(entry.key);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  for (auto& e : entries_)
    if (e.key == entry.key) {
      e = entry;
      return;
    }
  entries_.push_back(entry);
}

GemmTuneEntry GemmTuner::add_measurements(GemmTuneEntry fresh) {
  {
    std::lock_guard lock(mutex_);
    for (const auto* earlier : {&partial_entries_, &entries_})
      for (const GemmTuneEntry& e : *earlier)
        if (e.key == fresh.key) fresh = merge_measurements(std::move(fresh), e);
  }
  store(fresh);  // replaces the stored entry and drops the partial one
  return fresh;
}

std::vector<GemmTuneEntry> GemmTuner::entries() const {
  std::lock_guard lock(mutex_);
  return entries_;
}

void GemmTuner::clear() {
  std::lock_guard lock(mutex_);
  entries_.clear();
  partial_entries_.clear();
  decided_here_.clear();
  generation_.fetch_add(1, std::memory_order_acq_rel);
}

std::string GemmTuner::file() const {
  std::lock_guard lock(mutex_);
  return path_;
}

bool GemmTuner::strict() const {
  std::lock_guard lock(mutex_);
  return strict_;
}

std::string GemmTuner::set_file(const std::string& path, bool strict) {
  {
    std::lock_guard lock(mutex_);
    configured_ = true;
    path_ = path;
    strict_ = strict;
    foreign_entries_ = json::array();
    partial_entries_.clear();
    decided_here_.clear();
  }
  if (path.empty()) return "";
  // A forced kernel the environment names wrongly is its own error, not the file's: reading the
  // entries asks which kernels are candidates (considers_every_candidate).
  check_kernel_environment();
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
    return "tuning file " + path + " does not exist yet; " +
           (amx_model_on() ? "a run on the AMX tile model (CUBEVEC_AMX_MODEL=1) writes nothing there"
                           : "calibrations will be written there");
  try {
    const json doc = parse_tuning_document(path);
    if (doc["version"].get<int64_t>() != kVersion) {
      std::lock_guard lock(mutex_);
      path_.clear();  // another cubevec's file: neither read nor replaced
      return "tuning file " + path + " has format version " + doc["version"].dump() + ", this cubevec reads and writes " +
             std::to_string(kVersion) + "; not using it (it is left as it is; name another file with --tune-cache)";
    }
    ParsedGemmSection parsed = parse_gemm_section(doc.contains("gemm") ? doc["gemm"] : json::array(), cpu_model_name(), this_cpu_caches());
    {
      std::lock_guard lock(mutex_);
      foreign_entries_ = parsed.foreign;
      partial_entries_ = parsed.partial;
    }
    for (const auto& e : parsed.entries) store_entry(e, false);
    return parsed.warnings.empty() ? "" : "tuning file " + path + ": " + parsed.warnings;
  } catch (const Error& err) {
    const std::string message = invalid_file_message(path, err);
    if (strict) throw Error(message);
    std::lock_guard lock(mutex_);
    path_.clear();  // leave a file we cannot read alone
    return message + "; not using it";
  }
}

void GemmTuner::adopt_new_file_entries() {
  const std::string path = file();
  if (path.empty()) return;
  ParsedGemmSection parsed;
  try {
    const json section = read_tuning_section(path, "gemm");
    if (section.is_null()) return;
    parsed = parse_gemm_section(section, cpu_model_name(), this_cpu_caches());
  } catch (const Error&) {
    return;  // the save after the measurement says what is wrong with the file
  }
  for (const auto& e : parsed.entries)
    if (!find(e.key)) store_entry(e, false);
}

void GemmTuner::save() const {
  const std::string path = file();
  if (path.empty()) return;
  TuningFileLock file_lock(path);
  // The file as it is now: another process may have saved since this one read it.
  ParsedGemmSection now;
  const json section = read_tuning_section(path, "gemm");
  if (!section.is_null()) {
    try {
      now = parse_gemm_section(section, cpu_model_name(), this_cpu_caches());
    } catch (const Error& err) {
      throw Error(invalid_file_message(path, err));  // left alone, as a file found malformed on load
    }
  }
  std::vector<GemmTuneKey> in_file;
  for (const auto* list : {&now.entries, &now.partial})
    for (const auto& e : *list) in_file.push_back(e.key);
  json gemm;
  {
    std::lock_guard lock(mutex_);
    auto contains = [](const std::vector<GemmTuneKey>& keys, const GemmTuneKey& key) {
      return std::find(keys.begin(), keys.end(), key) != keys.end();
    };
    gemm = section.is_null() ? foreign_entries_ : now.foreign;
    for (const auto* list : {&now.entries, &now.partial})
      for (const auto& e : *list)
        if (!contains(decided_here_, e.key)) gemm.push_back(gemm_entry_json(e, cpu_model_name(), this_cpu_caches()));
    for (const auto& e : entries_)
      if (contains(decided_here_, e.key) || !contains(in_file, e.key))
        gemm.push_back(gemm_entry_json(e, cpu_model_name(), this_cpu_caches()));
    for (const auto& e : partial_entries_)
      if (!contains(in_file, e.key)) gemm.push_back(gemm_entry_json(e, cpu_model_name(), this_cpu_caches()));
  }
  write_tuning_section(path, "gemm", gemm);
}

json read_tuning_section(const std::string& path, const std::string& section) {
  const json doc = read_tuning_document(path);
  return doc.is_object() && doc.contains(section) ? doc[section] : json(nullptr);
}

namespace {
const std::string& with_folder(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;  // a folder that cannot be made: the lock goes without, the write says why
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  return path;
}
}  // namespace

TuningFileLock::TuningFileLock(const std::string& path) : lock_(with_folder(path), kTuningLockWait) {}

void write_tuning_section(const std::string& path, const std::string& section, const json& value) {
  // A run on the AMX tile model checks code; what it measured (the attention's picks among kernels
  // one of which runs on the model, say) must not become a real run's choices.
  if (amx_model_on()) return;
  TuningFileLock file_lock(path);         // creates the folder
  json doc = read_tuning_document(path);  // another format version: an Error, the file kept
  if (!doc.is_object()) doc = {{"format", kFormat}, {"version", kVersion}};
  doc[section] = value;
  // Renamed now, not with the run's outputs at its end (OutputBatch): other processes, and this
  // one's next save, must read what was just written.
  OutputFile out(path, "tuning file");
  out.write(doc.dump(1) + "\n");
  out.commit_now();
}

void GemmTuner::load_default_once() {
  {
    std::lock_guard lock(mutex_);
    if (configured_) return;
  }
  const std::string warning = set_file(default_tuning_path(), false);
  // A first run has no file yet: that is not worth a warning; anything else is.
  if (!warning.empty() && warning.find("does not exist yet") == std::string::npos)
    std::fprintf(stderr, "cubevec: warning: %s\n", warning.c_str());
}

void check_kernel_environment() {
  best_isa();
  amx_model_on();
  forced_bf16_path();
  forced_int8_isa();
}

GemmTuneEntry GemmTuner::choose(const GemmTuneKey& key) {
  if (auto model = amx_model_choice(key)) return *model;  // never timed, never stored
  load_default_once();
  if (auto found = find(key)) return *found;
  std::lock_guard measuring(measure_mutex_);
  if (auto found = find(key)) return *found;  // measured by another thread meanwhile
  const std::string path = file();
  std::optional<TuningFileLock> file_lock;  // another process measuring waits, then finds the key
  if (!path.empty()) file_lock.emplace(path);
  adopt_new_file_entries();
  if (auto found = find(key)) return *found;  // measured by another process meanwhile
  const GemmTuneEntry entry = add_measurements(calibrate(key, this_cpu_caches()));
  try {
    save();
  } catch (const Error& err) {
    std::fprintf(stderr, "cubevec: warning: the GEMM calibration was not saved: %s\n", err.what());
  }
  return entry;
}

}  // namespace cubevec::ops::gemm
