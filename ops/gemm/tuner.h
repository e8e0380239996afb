// GEMM calibration: which variant (bf16 kernel, L2 blocking share) runs fastest on this machine, per
// kernel family, ISA, shape class and thread count. The first GEMM of a kind measures each variant
// on a representative problem (a few milliseconds each) and keeps the fastest, as the attention
// autotuner does; the choices persist in the tuning file (read_tuning_section / write_tuning_section
// below, the default path in GemmTuner::load_default_once) so later runs and
// other processes skip the measurement and make the same choice.
//
// A choice that changes the summation (another bf16 kernel) beats the preferred one (AMX, then
// AVX512-BF16, then f32) only when it is clearly faster (kSwitchMargin): two processes that
// measure on a noisy machine then still agree to the bit.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/file_lock.h"
#include "ops/gemm/driver.h"

namespace cubevec::ops::gemm {

// The compute type: f32 (an int8 weight-only Linear computes in f32), bf16, or int8 (W8A8's u8 x s8).
enum class GemmFamily : uint8_t { f32, bf16, int8 };
enum class ShapeClass : uint8_t { skinny, small, large };  // M < 256, 256 <= M <= 1024, M > 1024
std::string_view gemm_family_name(GemmFamily family);
std::string_view shape_class_name(ShapeClass shape);
ShapeClass shape_class_of(int64_t m);

struct GemmTuneKey {
  GemmFamily family = GemmFamily::f32;
  Isa isa = Isa::portable;
  ShapeClass shape = ShapeClass::large;
  int threads = 1;
  bool operator==(const GemmTuneKey&) const = default;
  std::string text() const;  // "bf16 avx512 large 2 threads"
};

struct VariantRate {
  GemmVariant variant;
  double gflops = 0;  // the best of the timed runs on the class's representative problem
};

struct GemmTuneEntry {
  GemmTuneKey key;
  GemmVariant choice;
  std::vector<VariantRate> considered;  // empty when the choice was forced or loaded without rates
};

// The representative problem a shape class is measured on (M x N x K, B a Linear weight [N, K]).
struct ClassProblem {
  int64_t m, n, k;
};
ClassProblem class_problem(ShapeClass shape);

// The variants calibration weighs for a family and ISA: every available bf16 kernel (or only the one
// CUBEVEC_GEMM_BF16 forces) times the L2 shares 2, 4 and 8; the f32 AVX-512 kernel with and without
// its software prefetch; every VNNI int8 kernel of the CPU (or the one CUBEVEC_INT8_ISA forces; the
// portable one only where there is no VNNI) times the shares.
std::vector<GemmVariant> candidate_variants(GemmFamily family, Isa isa);

inline constexpr double kSwitchMargin = 1.05;

// The choice among measured rates: the fastest variant of the preferred kernel (AMX, AVX512-BF16,
// f32; AVX512-VNNI, AVX-VNNI, portable), unless another kernel is kSwitchMargin faster.
GemmVariant choose_variant(const std::vector<VariantRate>& rates);

// Reads every variable that forces a kernel (CUBEVEC_GEMM_ISA, CUBEVEC_AMX_MODEL, CUBEVEC_GEMM_BF16,
// CUBEVEC_INT8_ISA) now: a bad value is an Error naming it before any work (the CLI and
// Pipeline::load call this first), not a kernel's failure, or a tuning file's, later.
void check_kernel_environment();

// Where the AMX tile model is on (CUBEVEC_AMX_MODEL=1) and the key's family is forced onto AMX,
// the entry a run uses instead of measuring: the kernel at its first L2 share, no rates (the
// model's speed says nothing about AMX's, and nothing measured on it may reach the tuning file).
std::optional<GemmTuneEntry> amx_model_choice(const GemmTuneKey& key);

// Measures every candidate on the class's problem in a task arena of key.threads threads; with
// `progress`, reports each variant as it is measured.
GemmTuneEntry calibrate(const GemmTuneKey& key, const CpuCaches& caches, const std::function<void(const VariantRate&)>& progress = {});

// The bf16 kernel weights packed for `threads` Cube threads will use, without measuring: the forced
// one, else the tuning file's choice for large shapes, else f32 widening (the largest panels: an
// estimate made with it is an upper bound).
Bf16Path expected_bf16_path(Isa isa, int threads);

// The calibrated L2 share for int8 GEMMs on `kernel` (the packed weight's) with M rows on `threads`
// threads: the best share measured for that kernel (measured now if the tuning file has none).
int int8_l2_share(Int8Isa kernel, int64_t m, int threads);

class GemmTuner {
 public:
  // The tuner sgemm uses. On first use it loads the default tuning file unless set_file was called.
  static GemmTuner& global();

  // The entry for `key`: stored, else measured now (and saved to the tuning file, if any).
  GemmTuneEntry choose(const GemmTuneKey& key);
  std::optional<GemmTuneEntry> find(const GemmTuneKey& key) const;
  // Stores an entry this process decided (stored or measured): on save it replaces the file's
  // entry for its key. Entries only read from the file do not: another process may have replaced
  // them since.
  void store(const GemmTuneEntry& entry);
  // Stores a fresh calibration merged with what the tuner already has for its key (stored or
  // partial: merge_measurements) and returns the merged entry.
  GemmTuneEntry add_measurements(GemmTuneEntry fresh);
  std::vector<GemmTuneEntry> entries() const;
  void clear();
  // Changes whenever an entry is stored or cleared (sgemm's per-thread copies check it).
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

  // Where measurements are saved ("" for none). Loads the file's entries now; returns the warnings
  // (a stale entry, a file that does not exist yet). `strict`: a malformed file is an Error
  // (an explicit --tune-cache); otherwise a warning, and the file is left alone until rewritten.
  std::string set_file(const std::string& path, bool strict);
  std::string file() const;
  // Whether the file was named (set_file's `strict`): then every section of it must be valid.
  bool strict() const;
  // Loads the default tuning file ($XDG_CACHE_HOME/cubevec/tuning.json, else
  // ~/.cache/cubevec/tuning.json) unless set_file was called; warnings go to stderr. choose() does
  // this on first use.
  void load_default_once();
  // Writes the entries to the file (atomically) under the tuning file's lock (TuningFileLock),
  // merged with what the file holds now: the entries this process stored or measured replace the
  // file's for their keys; for every other key the file's entry stays (another process may have
  // measured it since this one read the file) and this process's is added only where the file has
  // none; other machines' entries are kept.
  void save() const;
  // Under the file lock, before measuring: stores the file's entries for keys this tuner lacks
  // (another process measured them meanwhile). A file that cannot be read now adds nothing.
  void adopt_new_file_entries();

 private:
  void store_entry(const GemmTuneEntry& entry, bool decided_here);

  mutable std::mutex mutex_;
  std::mutex measure_mutex_;  // one measurement at a time (two would time each other)
  std::vector<GemmTuneEntry> entries_;
  std::vector<GemmTuneEntry> partial_entries_;                // ParsedGemmSection::partial, until measured
  std::vector<GemmTuneKey> decided_here_;                     // keys stored or measured by this process (save)
  nlohmann::json foreign_entries_ = nlohmann::json::array();  // other CPUs' entries, kept on save
  std::string path_;
  bool configured_ = false;
  bool strict_ = false;
  std::atomic<uint64_t> generation_{0};
};

// The tuning file's cross-process lock (base/file_lock.h): held while a process measures a key
// and saves it, and around every section write, so that two processes neither measure the same key
// side by side (each would time the other, and they could pick differently) nor lose each other's
// sections or entries by read-modify-write. A holder that takes longer than this (a stopped process)
// is gone around with a warning.
inline constexpr std::chrono::seconds kTuningLockWait{120};
class TuningFileLock {
 public:
  // Creates the file's folder first (a fresh cache folder: the first processes are the ones that race).
  explicit TuningFileLock(const std::string& path);

 private:
  FileLock lock_;
};

// The tuning file holds one section per tuner ("gemm" here, "attention" for ops/attention_tuner.h).
// Each writer replaces its own section and keeps the others: under the TuningFileLock the file is
// read, changed and renamed over itself (write_output_file). A file of another format version
// (another cubevec's, written since this process looked) is left as it is: an Error.
void write_tuning_section(const std::string& path, const std::string& section, const nlohmann::json& value);
// The section's value in the tuning file at `path`: null when the file or the section is absent.
// Throws Error naming the file when it is not a valid tuning file or has another format version.
nlohmann::json read_tuning_section(const std::string& path, const std::string& section);

// The tuning file's "gemm" section: entries for this CPU (model and caches) and thread counts are
// loaded, others ignored with a warning but kept. Throws Error on a malformed section.
struct ParsedGemmSection {
  std::vector<GemmTuneEntry> entries;
  // This CPU's entries without measurements of a kernel this process would weigh (one added since
  // the file was written, or one forced by CUBEVEC_INT8_ISA / CUBEVEC_GEMM_BF16): the missing kernel
  // is measured on first use and its rates added to the entry's (merge_measurements).
  std::vector<GemmTuneEntry> partial;
  nlohmann::json foreign = nlohmann::json::array();
  std::string warnings;
};
ParsedGemmSection parse_gemm_section(const nlohmann::json& section, const std::string& cpu, const CpuCaches& caches);
nlohmann::json gemm_entry_json(const GemmTuneEntry& entry, const std::string& cpu, const CpuCaches& caches);
// `fresh` with the rates of `earlier` (the same key) for the variants it did not measure, and the
// choice made again over them all: a run that forces one kernel adds its rates to the file's entry
// instead of replacing the other kernels' (which the next unforced run would measure again).
GemmTuneEntry merge_measurements(GemmTuneEntry fresh, const GemmTuneEntry& earlier);

}  // namespace cubevec::ops::gemm
