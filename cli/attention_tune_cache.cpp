#include "cli/attention_tune_cache.h"

#include <cstdio>

#include "ops/attention_tuner.h"
#include "tensor/error.h"

namespace cubevec::cli {

void AttentionTuneCacheFlag::load(const Device& device) const {
  if (path.empty()) return;
  const std::string warning = ops::AttentionTuner::global().load(path, ops::attention_tune_fingerprint(device));
  if (!warning.empty()) std::fprintf(stderr, "warning: %s\n", warning.c_str());
  else std::fprintf(stderr, "attention tune cache: %zu entries from %s\n", ops::AttentionTuner::global().entries().size(), path.c_str());
}

void AttentionTuneCacheFlag::save(const Device& device) const {
  if (path.empty() || !ops::AttentionTuner::global().changed()) return;
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
                     "JSON file of attention autotuner picks: read before the run (tuning what it lacks), written after");
  return flag;
}

}  // namespace cubevec::cli
