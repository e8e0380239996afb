// Cache tuning as MindIE SD documents it (its docs/*/features/cache.md; docs/stages.md, "Cache
// tuning as MindIE SD documents it"): from a target speedup, the least caching that can reach it;
// candidate settings around that; each candidate run and compared with the uncached output; the
// one with the smallest MSE whose measured speedup reaches the target wins.
//   dit-block: the replayed steps follow --cache-step-start / --cache-interval; the span length is
//     the fewest blocks whose skipping reaches the target (block 0 is always computed); every span
//     of that length (and one longer) is ranked by a cheap proxy from one recorded uncached run (how
//     much the span's residual moves from its last computed step to each replayed step) and the 3
//     best are run in full (MindIE's "three best candidates, then the smallest MSE").
//   attention: the share of the step time the attention modules take is measured (one run that
//     replays every attention after step 0); from it the fewest replayed steps; candidates over
//     step_start, interval and step_end with at least that many, the least caching first, run in full.
// The MSE is taken on the final latents (the denoiser's output, before the VAE).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pipelines/stage.h"
#include "pipelines/stages/cache_config.h"

namespace cubevec::pipelines {

struct CacheTuneOptions {
  double target_speedup = 1.6;
  std::vector<CacheMethod> methods{CacheMethod::dit_block, CacheMethod::attention};
  std::optional<int> step_start, interval;  // dit-block's replay schedule (default: steps / 5, 2)
  int max_trials = 6;                       // full runs per method, beyond the reference
};

struct CacheTrial {
  CacheConfig config;
  double seconds = 0;  // denoising
  double speedup = 0;  // reference seconds / seconds
  double mse = 0;      // of the final latents against the uncached run
  double proxy = 0;    // dit-block's ranking proxy (0 where none)
  bool reaches_target = false;
};

struct CacheTuneResult {
  double reference_seconds = 0;
  std::vector<CacheTrial> trials;
  std::optional<CacheTrial> chosen;  // none when no candidate reached the target
  std::vector<std::string> notes;    // why a method had no candidate, ...
};

// One generation with `stages` (empty: uncached): the final latents and the denoising seconds.
using CacheTuneRun = std::function<std::pair<Tensor, double>(StageList& stages)>;
// Progress: what is being run.
using CacheTuneProgress = std::function<void(const std::string&)>;

CacheTuneResult tune_cache(const CacheTuneRun& run, int steps, int blocks, const CacheTuneOptions& options,
                           const CacheTuneProgress& progress = {});

// Mean squared difference of two tensors of one shape (f32 or bf16), in double.
double mean_squared_error(const Tensor& a, const Tensor& b);

}  // namespace cubevec::pipelines
