// The autotuner behind attention_forward's opt_mode "runtime": the first call for a key times the
// candidate (implementation, kernel layout) pairs and keeps the fastest; later calls look it up.
// Unlike MindIE SD's in-process cache, the table can be saved to and loaded from a JSON file
// (the CLI's --attn-tune-cache), so a process need not tune again:
//
//   {"format": "cubevec-attention-tune-cache", "version": 1, "fingerprint": "...",
//    "entries": [{"batch": 1, "heads": 24, "head_dim": 128, "q_len": 4608, "kv_len": 4608,
//                 "dtype": "f32", "layout": "BSND", "mask": "none",
//                 "op_type": "flash", "kernel_layout": "BNSD", "seconds": 0.93}, ...]}
//
// The fingerprint names what the timings depend on (ISA, the device's thread counts); a file
// tuned elsewhere is stale and ignored with a warning, a malformed one is an error.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "device/device.h"
#include "ops/attention.h"

namespace cubevec::ops {

// mask_*: a boolean attn_mask; bias_*: an f32 (additive) one; block_sparse: block_sparse_attention's
// 128 x 128 block mask.
enum class AttentionMaskKind { none, mask_2d, mask_4d, block_sparse, bias_2d, bias_4d };
std::string_view attention_mask_kind_name(AttentionMaskKind kind);  // "none", "2d", "4d", "block", "bias2d", "bias4d"

struct AttentionTuneKey {
  int64_t batch = 0, heads = 0, head_dim = 0, q_len = 0, kv_len = 0;
  DType dtype = DType::f32;
  AttentionLayout layout = AttentionLayout::bsnd;
  AttentionMaskKind mask = AttentionMaskKind::none;
  bool operator==(const AttentionTuneKey&) const = default;
  std::string text() const;  // "B1 N24 D128 Sq4608 Sk4608 f32 BSND mask none"
};

struct AttentionTuneChoice {
  AttentionImpl op_type = AttentionImpl::flash;
  AttentionLayout kernel_layout = AttentionLayout::bnsd;
  double seconds = 0;  // the measured time that won (0 for a static choice)
};

// Where the picks are shared with other processes (the CLI's tuning file, cli/attention_tune_cache.h):
// before tuning a key the tuner reloads it (a key another process tuned meanwhile is used, not
// tuned again), and after tuning one it saves at once (the runs after read it). Neither may throw:
// a file that cannot be used is the implementation's warning, never a failed run.
class AttentionPicksFile {
 public:
  virtual ~AttentionPicksFile() = default;
  virtual void reload() noexcept = 0;
  virtual void save() noexcept = 0;
};

class AttentionTuner {
 public:
  static constexpr std::size_t kMaxEntries = 512;  // as MindIE SD's LRU; the oldest entry goes first

  // The tuner attention_forward uses.
  static AttentionTuner& global();

  std::optional<AttentionTuneChoice> find(const AttentionTuneKey& key) const;
  void store(const AttentionTuneKey& key, const AttentionTuneChoice& choice);
  std::vector<std::pair<AttentionTuneKey, AttentionTuneChoice>> entries() const;
  void clear();

  // Adds the file's entries. Returns a warning (empty when none): the file does not exist yet, or
  // it was tuned for another fingerprint (its entries are then ignored). Throws cubevec::Error
  // naming the file and the problem when it is not a valid cache.
  std::string load(const std::string& path, const std::string& fingerprint);
  // Writes every entry (atomically: a temporary file renamed over `path`).
  void save(const std::string& path, const std::string& fingerprint) const;
  // The tuning file's "attention" section (ops/gemm/tuner.h): entries as above, each with its
  // fingerprint. add_section stores those tuned for `fingerprint` and puts the others in `foreign`
  // (returning how many); section gives `foreign` plus every entry of this tuner. Malformed: Error.
  // With `only_missing`, the section's entries for keys this tuner already has are skipped and
  // changed() is left as it was (a reload during the run, not a load before it).
  std::size_t add_section(const nlohmann::json& section, const std::string& fingerprint, nlohmann::json& foreign,
                          bool only_missing = false);
  nlohmann::json section(const std::string& fingerprint, const nlohmann::json& foreign) const;
  // What to write back to a tuning file whose attention section is now `current` (read under the
  // TuningFileLock; null when absent, then it is `section`): `current` as it is, plus this tuner's
  // entries for keys it has none of under `fingerprint`. The file's own entries stay: the first
  // process to tune a key decides it for the runs after, though this one may have tuned the same key
  // side by side and used its own pick. A malformed `current` throws Error.
  nlohmann::json merged_section(const nlohmann::json& current, const std::string& fingerprint, const nlohmann::json& foreign) const;
  // Whether an entry was added or changed since the last load or save (a cache that needs no
  // update is not rewritten: it may be read-only).
  bool changed() const;

  // The picks file runtime-mode tuning consults and updates (null: none; the library and server
  // keep their picks in memory).
  void set_picks_file(std::shared_ptr<AttentionPicksFile> file);
  std::shared_ptr<AttentionPicksFile> picks_file() const;

 private:
  // store(), saying whether the entry counts as a change to save (a pick reread from the file does not).
  void store_entry(const AttentionTuneKey& key, const AttentionTuneChoice& choice, bool is_change);
  // `out` plus every entry whose key is not in `skip`, each with `fingerprint`; clears changed().
  nlohmann::json with_entries(nlohmann::json out, const std::string& fingerprint, const std::vector<AttentionTuneKey>& skip) const;

  mutable std::mutex mutex_;
  std::vector<std::pair<AttentionTuneKey, AttentionTuneChoice>> entries_;
  std::shared_ptr<AttentionPicksFile> picks_file_;
  mutable bool changed_ = false;
};

// What the timings depend on: this CPU's kernel ISA and the device's Cube and Vector thread counts.
std::string attention_tune_fingerprint(const Device& device);

}  // namespace cubevec::ops
