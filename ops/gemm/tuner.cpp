#include "ops/gemm/tuner.h"

#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "base/enum_names.h"
#include "base/error.h"
#include "tensor/half.h"
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
constexpr int kShares[] = {2, 4, 8};

// Preference among kernels when their rates are close: the one with the most compute per instruction
// (0 first, below kRanks).
constexpr int kRanks = 5;
int preference_rank(const GemmVariant& v) {
  if (v.int8) return static_cast<int>(*v.int8);  // amx, avx512_vnni, avx_vnni, avx2, portable
  return v.bf16 == Bf16Path::amx ? 0 : v.bf16 == Bf16Path::dot ? 1 : 2;
}

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

// The tuning file at `path` parsed, its format and version fields checked (any version); throws
// Error with the reason otherwise.
json parse_tuning_document(const std::string& path) {
  json doc = parse_strict_json(read_regular_file(path), 8);
  if (!doc.is_object()) throw Error("expected a JSON object at the top level");
  if (!doc.contains("format") || doc["format"] != kFormat) throw Error(std::string("field 'format' must be \"") + kFormat + "\"");
  if (!doc.contains("version") || !doc["version"].is_number_integer()) throw Error("field 'version' must be an integer");
  return doc;
}

std::string invalid_file_message(const std::string& path, const std::string& reason) {
  return "tuning file " + path + " is not valid: " + reason +
         " (if it is a damaged tuning file, delete it to measure again; otherwise name another file)";
}

// The file's document, or null when it does not exist or has another format version.
json read_tuning_document(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return nullptr;
  json doc;
  try {
    doc = parse_tuning_document(path);
  } catch (const Error& err) {
    throw Error(invalid_file_message(path, err.what()));
  }
  return doc["version"].get<int64_t>() == kVersion ? doc : json(nullptr);
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

ClassProblem class_problem(ShapeClass shape) {
  // A DiT Linear's N (3072: FLUX.1's width): with a smaller N the packed B of a K block stays in L2
  // and the blockings rank differently than on real layers (measured: an AMX share that won by 5%
  // at N = 1536 lost by 20% at N = 3072). M is the class's middle. K is one AMX / f32 K block pair
  // for the smaller classes; the large class takes a DiT's K (3072) too: at K = 1024 a Zen 4's f32
  // variants measured 169-176 GFLOP/s where the real layers ran at 181-211; at K = 3072, 205-213.
  switch (shape) {
    case ShapeClass::skinny: return {64, 3072, 1024};
    case ShapeClass::small: return {512, 3072, 1024};
    case ShapeClass::large: return {2048, 3072, 3072};
  }
  return {2048, 3072, 3072};
}

std::vector<GemmVariant> candidate_variants(GemmFamily family, Isa isa) {
  if (family == GemmFamily::int8) {
    std::vector<Int8Isa> kernels;
    if (const auto forced = forced_int8_isa()) kernels = {*forced};
    else
      for (Int8Isa k : {Int8Isa::amx, Int8Isa::avx512_vnni, Int8Isa::avx_vnni, Int8Isa::avx2})
        if (int8_isa_supported(k)) kernels.push_back(k);
    if (kernels.empty()) kernels = {Int8Isa::portable};  // measured only where nothing faster exists
    std::vector<GemmVariant> out;
    for (Int8Isa k : kernels)
      for (int share : kShares) out.push_back({Bf16Path::f32, share, false, k});
    return out;
  }
  std::vector<Bf16Path> paths{Bf16Path::f32};
  if (family == GemmFamily::bf16 && isa == Isa::avx512) {
    if (const auto forced = forced_bf16_path()) paths = {*forced};
    else {
      paths.clear();
      for (Bf16Path p : {Bf16Path::amx, Bf16Path::dot, Bf16Path::f32})
        if (bf16_path_available(p)) paths.push_back(p);
    }
  }
  std::vector<GemmVariant> out;
  for (Bf16Path p : paths)
    for (int share : kShares) {
      out.push_back({p, share, false});
      if (p == Bf16Path::f32 && isa == Isa::avx512) out.push_back({p, share, true});
    }
  return out;
}

GemmVariant choose_variant(const std::vector<VariantRate>& rates) {
  if (rates.empty()) throw Error("gemm calibration: no variant was measured");
  // Each kernel's best share, then the preferred kernel unless another is clearly faster.
  std::optional<VariantRate> best_of[kRanks];
  for (const VariantRate& r : rates) {
    auto& slot = best_of[preference_rank(r.variant)];
    if (!slot || r.gflops > slot->gflops) slot = r;
  }
  std::optional<VariantRate> choice;
  for (const auto& candidate : best_of) {
    if (!candidate) continue;
    if (!choice || candidate->gflops > choice->gflops * kSwitchMargin) choice = candidate;
  }
  return choice->variant;
}

namespace {

// Each variant's best of two runs after a warm-up (which fills the caches and the workspace), the
// variants taking turns: round 0 warms every one up, rounds 1 and 2 time each once. On a shared
// machine the minimum is the steadier estimate of what a variant can do, and taking turns spreads a
// burst of someone else's work over all of them instead of sinking the one measured meanwhile (run
// back to back, the L2 shares of one kernel swapped places between calibrations on a noisy Zen 3).
// `progress` hears of each variant once, when its last run is timed.
void time_variants(const std::vector<GemmVariant>& variants, double flops, const std::function<void(std::size_t)>& run,
                   GemmTuneEntry& entry, const std::function<void(const VariantRate&)>& progress) {
  std::vector<double> best(variants.size(), 1e30);
  constexpr int kRounds = 3;
  for (int round = 0; round < kRounds; ++round)
    for (std::size_t i = 0; i < variants.size(); ++i) {
      const auto start = std::chrono::steady_clock::now();
      run(i);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (round > 0) best[i] = std::min(best[i], s);
      if (round == kRounds - 1) {
        const VariantRate rate{variants[i], flops / std::max(best[i], 1e-9) / 1e9};
        entry.considered.push_back(rate);
        if (progress) progress(rate);
      }
    }
}

// The float families (f32, bf16) on the class's problem: a Linear's weight packed once per kernel.
void measure_float(const GemmTuneKey& key, const ClassProblem& shape, const CpuCaches& caches, GemmTuneEntry& entry,
                   const std::function<void(const VariantRate&)>& progress) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> a(static_cast<std::size_t>(shape.m * shape.k)), w32(static_cast<std::size_t>(shape.n * shape.k)),
      c(static_cast<std::size_t>(shape.m * shape.n));
  for (float& v : a) v = dist(rng);
  for (float& v : w32) v = dist(rng);
  std::vector<uint16_t> w16(w32.size());
  convert_f32_to_bf16(w32.data(), w16.data(), w32.size());

  Problem p;
  p.m = shape.m, p.n = shape.n, p.k = shape.k;
  p.a = a.data(), p.lda = shape.k;
  p.trans_b = true, p.ldb = shape.k;
  p.c = c.data(), p.ldc = shape.n;
  // bf16: activations and weights both bf16, as a --dtype bf16 model runs.
  std::vector<uint16_t> a16(a.size());
  convert_f32_to_bf16(a.data(), a16.data(), a.size());
  if (key.family == GemmFamily::bf16) {
    p.a = a16.data(), p.a_type = Element::bf16;
    p.b = w16.data(), p.b_type = Element::bf16, p.compute = Element::bf16;
  } else {
    p.b = w32.data();
  }
  // Models pack their weights once; so does the measurement, once per bf16 kernel.
  const std::vector<GemmVariant> variants = candidate_variants(key.family, key.isa);
  std::vector<std::shared_ptr<const PackedB>> packed(variants.size());
  for (std::size_t i = 0; i < variants.size(); ++i) {
    for (std::size_t j = 0; j < i && !packed[i]; ++j)
      if (variants[j].bf16 == variants[i].bf16) packed[i] = packed[j];
    if (!packed[i]) packed[i] = pack_b_once_for(p, key.isa, key.family == GemmFamily::bf16 ? variants[i].bf16 : Bf16Path::f32);
  }
  const double flops = 2.0 * static_cast<double>(shape.m * shape.n * shape.k);
  time_variants(
      variants, flops,
      [&](std::size_t i) {
        Problem run = p;
        run.packed_b = packed[i].get();
        sgemm_variant(run, key.isa, key.threads, variants[i], caches);
      },
      entry, progress);
}

// The int8 family on the class's problem: quantized activations (u8, s8 + 128) times an s8 weight
// packed once per kernel, with W8A8's per-token and per-channel scales in the epilogue.
void measure_int8(const GemmTuneKey& key, const ClassProblem& shape, const CpuCaches& caches, GemmTuneEntry& entry,
                  const std::function<void(const VariantRate&)>& progress) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> dist(-127, 127);
  std::vector<uint8_t> a(static_cast<std::size_t>(shape.m * shape.k));
  std::vector<int8_t> w(static_cast<std::size_t>(shape.n * shape.k));
  for (uint8_t& v : a) v = static_cast<uint8_t>(dist(rng) + 128);
  for (int8_t& v : w) v = static_cast<int8_t>(dist(rng));
  std::vector<float> c(static_cast<std::size_t>(shape.m * shape.n)), row_scale(static_cast<std::size_t>(shape.m), 0.01f),
      col_scale(static_cast<std::size_t>(shape.n), 0.01f);
  const std::vector<GemmVariant> variants = candidate_variants(GemmFamily::int8, key.isa);
  std::vector<std::shared_ptr<const PackedInt8>> packed(variants.size());
  for (std::size_t i = 0; i < variants.size(); ++i) {
    for (std::size_t j = 0; j < i && !packed[i]; ++j)
      if (variants[j].int8 == variants[i].int8) packed[i] = packed[j];
    if (!packed[i]) packed[i] = pack_int8_weight(w.data(), shape.n, shape.k, shape.k, *variants[i].int8);
  }
  const double flops = 2.0 * static_cast<double>(shape.m * shape.n * shape.k);
  time_variants(
      variants, flops,
      [&](std::size_t i) {
        Int8Problem p;
        p.m = shape.m, p.n = shape.n;
        p.a = a.data(), p.lda = 4 * packed[i]->k_quads;  // K = 1024: no padding
        p.b = packed[i].get();
        p.c = c.data(), p.ldc = shape.n;
        p.epilogue.row_scale = row_scale.data(), p.epilogue.col_scale = col_scale.data();
        gemm_int8_variant(p, key.threads, variants[i].l2_share, caches);
      },
      entry, progress);
}

// The variant of `entry` (if any) for a kernel fixed by a packed weight: its best measured share.
GemmVariant best_for_int8_kernel(const GemmTuneEntry& entry, Int8Isa kernel) {
  GemmVariant best{Bf16Path::f32, 2, false, kernel};
  double rate = -1;
  for (const VariantRate& r : entry.considered)
    if (r.variant.int8 == kernel && r.gflops > rate) best = r.variant, rate = r.gflops;
  return best;
}

}  // namespace

GemmTuneEntry calibrate(const GemmTuneKey& key, const CpuCaches& caches, const std::function<void(const VariantRate&)>& progress) {
  if (key.threads < 1) throw Error("gemm calibration: threads must be at least 1, got " + std::to_string(key.threads));
  if (!isa_supported(key.isa)) throw Error("gemm calibration: ISA " + std::string(isa_name(key.isa)) + " is not supported by this CPU");
  GemmTuneEntry entry;
  entry.key = key;
  tbb::task_arena arena(key.threads);
  arena.execute([&] {
    if (key.family == GemmFamily::int8) measure_int8(key, class_problem(key.shape), caches, entry, progress);
    else measure_float(key, class_problem(key.shape), caches, entry, progress);
  });
  entry.choice = choose_variant(entry.considered);
  return entry;
}

Int8Isa chosen_int8_isa(int threads) {
  if (const auto forced = forced_int8_isa()) return *forced;
  const GemmTuneEntry entry = GemmTuner::global().choose({GemmFamily::int8, best_isa(), ShapeClass::large, std::max(threads, 1)});
  return entry.choice.int8.value_or(best_int8_isa());
}

int int8_l2_share(Int8Isa kernel, int64_t m, int threads) {
  const GemmTuneEntry entry = GemmTuner::global().choose({GemmFamily::int8, best_isa(), shape_class_of(m), std::max(threads, 1)});
  return best_for_int8_kernel(entry, kernel).l2_share;
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

void GemmTuner::store(const GemmTuneEntry& entry) {
  std::lock_guard lock(mutex_);
  std::erase_if(partial_entries_, [&](const GemmTuneEntry& e) { return e.key == entry.key; });  // superseded
  for (auto& e : entries_)
    if (e.key == entry.key) {
      e = entry;
      generation_.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
  entries_.push_back(entry);
  generation_.fetch_add(1, std::memory_order_acq_rel);
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
  }
  if (path.empty()) return "";
  // A forced kernel the environment names wrongly is its own error, not the file's: reading the
  // entries asks which kernels are candidates (considers_every_candidate).
  forced_bf16_path();
  forced_int8_isa();
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
    return "tuning file " + path + " does not exist yet; calibrations will be written there";
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
    for (const auto& e : parsed.entries) store(e);
    return parsed.warnings.empty() ? "" : "tuning file " + path + ": " + parsed.warnings;
  } catch (const Error& err) {
    const std::string message = invalid_file_message(path, err.what());
    if (strict) throw Error(message);
    std::lock_guard lock(mutex_);
    path_.clear();  // leave a file we cannot read alone
    return message + "; not using it";
  }
}

void GemmTuner::save() const {
  json gemm;
  std::string path;
  {
    std::lock_guard lock(mutex_);
    path = path_;
    gemm = foreign_entries_;
    for (const auto& e : entries_) gemm.push_back(gemm_entry_json(e, cpu_model_name(), this_cpu_caches()));
    for (const auto& e : partial_entries_) gemm.push_back(gemm_entry_json(e, cpu_model_name(), this_cpu_caches()));
  }
  if (!path.empty()) write_tuning_section(path, "gemm", gemm);
}

json read_tuning_section(const std::string& path, const std::string& section) {
  const json doc = read_tuning_document(path);
  return doc.is_object() && doc.contains(section) ? doc[section] : json(nullptr);
}

void write_tuning_section(const std::string& path, const std::string& section, const json& value) {
  json doc = read_tuning_document(path);
  if (!doc.is_object()) doc = {{"format", kFormat}, {"version", kVersion}};
  doc[section] = value;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  write_output_file(path, "tuning file", doc.dump(1) + "\n");
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

GemmTuneEntry GemmTuner::choose(const GemmTuneKey& key) {
  load_default_once();
  if (auto found = find(key)) return *found;
  std::lock_guard measuring(measure_mutex_);
  if (auto found = find(key)) return *found;  // measured by another thread meanwhile
  const GemmTuneEntry entry = add_measurements(calibrate(key, this_cpu_caches()));
  try {
    save();
  } catch (const Error& err) {
    std::fprintf(stderr, "cubevec: warning: the GEMM calibration was not saved: %s\n", err.what());
  }
  return entry;
}

}  // namespace cubevec::ops::gemm
