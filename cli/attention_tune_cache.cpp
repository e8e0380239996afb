#include "cli/attention_tune_cache.h"

#include <atomic>
#include <cstdio>

#include "ops/attention_tuner.h"
#include "ops/gemm/tuner.h"
#include "base/error.h"
#include "base/interrupt.h"

namespace cubevec::cli {

namespace {

// The tuning file (--tune-cache, else the default one), where the picks go without --attn-tune-cache.
std::string tuning_file() {
  ops::gemm::GemmTuner& tuner = ops::gemm::GemmTuner::global();
  tuner.load_default_once();
  return tuner.file();
}

// The tuning file's attention section as the tuner's picks file: reread before a key is tuned,
// written (merged, under the file's lock) right after, so processes running side by side tune a key
// once between them unless they reach it within the same tuning.
class TuningFilePicks : public ops::AttentionPicksFile {
 public:
  TuningFilePicks(std::string file, std::string fingerprint, std::shared_ptr<nlohmann::json> foreign)
      : file_(std::move(file)), fingerprint_(std::move(fingerprint)), foreign_(std::move(foreign)) {}

  void reload() noexcept override {
    try {
      const ops::gemm::TuningFileLock file_lock(file_);
      const nlohmann::json section = ops::gemm::read_tuning_section(file_, "attention");
      if (!section.is_null()) ops::AttentionTuner::global().add_section(section, fingerprint_, *foreign_, /*only_missing=*/true);
    } catch (...) {
      // Tuned here instead; the save right after (or the run's end) says what is wrong with the file.
    }
  }

  void save() noexcept override {
    if (ops::gemm::amx_model_on()) return;  // nothing a run on the AMX tile model measured is saved
    try {
      write();
    } catch (const std::exception& e) {
      warn(e);
    }
  }

  // Reads, merges and writes under the lock: processes saving side by side keep each other's picks.
  void write() const {
    const ops::gemm::TuningFileLock file_lock(file_);
    const nlohmann::json current = ops::gemm::read_tuning_section(file_, "attention");
    ops::gemm::write_tuning_section(file_, "attention", ops::AttentionTuner::global().merged_section(current, fingerprint_, *foreign_));
  }

  // One warning per run, naming the file (a malformed section's message does not).
  void warn(const std::exception& e) {
    std::string reason = e.what();
    if (reason.find(file_) == std::string::npos) reason = "tuning file " + file_ + ": " + reason;
    if (!warned_.exchange(true)) std::fprintf(stderr, "warning: the attention picks were not saved: %s\n", reason.c_str());
  }

 private:
  std::string file_, fingerprint_;
  std::shared_ptr<nlohmann::json> foreign_;
  std::atomic<bool> warned_{false};  // saves may come from the threads of several streams
};

}  // namespace

void AttentionTuneCacheFlag::load(const Device& device) const {
  if (path.empty()) {
    const std::string file = tuning_file();
    if (file.empty()) return;
    try {
      const nlohmann::json section = ops::gemm::read_tuning_section(file, "attention");
      // Entries tuned for other thread counts or CPUs are kept aside and written back, silently: a
      // machine-sized default and an explicit --cube-threads both being in use is routine.
      if (!section.is_null()) ops::AttentionTuner::global().add_section(section, ops::attention_tune_fingerprint(device), *foreign_);
      ops::AttentionTuner::global().set_picks_file(
          std::make_shared<TuningFilePicks>(file, ops::attention_tune_fingerprint(device), foreign_));
    } catch (const Error& e) {
      // A file named with --tune-cache must be valid throughout, as its GEMM section must; the
      // default file is left alone with a warning.
      const std::string message = "tuning file " + file + " is not valid: " + e.what();
      if (ops::gemm::GemmTuner::global().strict()) throw Error(message);
      std::fprintf(stderr, "warning: %s; its attention picks are not used or updated\n", message.c_str());
      *unusable_ = true;
    }
    return;
  }
  const std::string warning = ops::AttentionTuner::global().load(path, ops::attention_tune_fingerprint(device));
  if (!warning.empty()) std::fprintf(stderr, "warning: %s\n", warning.c_str());
  else std::fprintf(stderr, "attention tune cache: %zu entries from %s\n", ops::AttentionTuner::global().entries().size(), path.c_str());
}

void AttentionTuneCacheFlag::save(const Device& device) const {
  // A run on the AMX tile model keeps its picks to itself (see ops::gemm::amx_model_on).
  if (!ops::AttentionTuner::global().changed() || ops::gemm::amx_model_on()) return;
  if (path.empty()) {
    const std::string file = tuning_file();
    if (file.empty() || *unusable_) return;
    const auto picks = std::dynamic_pointer_cast<TuningFilePicks>(ops::AttentionTuner::global().picks_file());
    if (!picks) return;  // load() found the file unusable
    try {
      picks->write();
    } catch (const Interrupted&) {
      throw;  // Ctrl-C while waiting for the file's lock stops the run, as anywhere else
    } catch (const Error& e) {
      picks->warn(e);
    }
    return;
  }
  // The run itself succeeded: a cache that cannot be written is worth a warning, not a failure.
  try {
    ops::AttentionTuner::global().save(path, ops::attention_tune_fingerprint(device));
  } catch (const Error& e) {
    std::fprintf(stderr, "warning: the attention tune cache was not saved: %s\n", e.what());
  }
}

std::shared_ptr<AttentionTuneCacheFlag> add_attention_tune_cache_flag(CLI::App& command) {
  auto flag = std::make_shared<AttentionTuneCacheFlag>();
  command.add_option("--attn-tune-cache", flag->path,
                     "JSON file of attention autotuner picks: read before the run (tuning what it lacks), written after "
                     "(default: the tuning file's attention section, see --tune-cache)");
  return flag;
}

}  // namespace cubevec::cli
