// The acceleration-stage flags t2i and t2v share, and the StageList they build:
//   --quant DESCRIPTION.json [--timestep-policy POLICY.json]   (pipelines/stages/quantize.h)
// and the step caches (pipelines/stages/cache_config.h)
//   --cache none|attention|dit-block|db
//   --cache-step-start N --cache-interval N --cache-step-end N --cache-block-start N --cache-block-end N
//   --cache-fn N --cache-bn N --cache-threshold X --cache-warmup N --cache-max-cached N
//   --cache-max-continuous N --taylorseer 1|2
//   --cache-config FILE.json   (the same keys without the dashes; flags given too override it)
// and sparse attention (pipelines/stages/sparse_attention.h)
//   --sparse none|rf_v2|ada_bsa --sparsity X --sparse-step-start N --sparse-blocks A-B
//   --sparse-mask-refresh K --sparse-cdf-threshold X
// and quantized attention (pipelines/stages/quant_attention.h)
//   --quant-attention none|int8
// and weight streaming (pipelines/stages/offload.h)
//   --offload R
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipelines/stage.h"
#include "pipelines/stages/cache_config.h"
#include "pipelines/stages/offload.h"
#include "pipelines/stages/sparse_attention.h"

namespace cubevec::cli {

struct StageFlags {
  std::string quant, timestep_policy, quant_2;
  std::string cache = "none", cache_config;
  pipelines::CacheConfig values;    // the flags' values (defaults where not given)
  int step_end = 0, block_end = 0;  // --cache-step-end, --cache-block-end when given
  std::string sparse = "none", sparse_blocks;
  pipelines::SparseConfig sparse_values;
  std::string quant_attention = "none";  // --quant-attention
  int offload = 0;                       // --offload R: resident blocks (0: off)
  std::vector<CLI::Option*> options;     // to know which were given

  bool quant_given() const;  // --quant on the command line
  // The cache settings: --cache-config's file, with the flags given on the command line over it.
  // Flags that do not apply to the method are errors.
  pipelines::CacheConfig cache_settings() const;
  // The quantization stage (its files read and checked now), or null without --quant.
  // `steps`: the run's steps (simulate: rows of shape-only W8A8_TIMESTEP scales).
  std::unique_ptr<pipelines::Stage> quantize_stage(bool simulate, int steps) const;
  // The sparse attention stage, or null without --sparse (its other flags alone are errors).
  std::unique_ptr<pipelines::SparseAttentionStage> sparse_stage() const;
  // The offload stage for a model with these block modules (models' block_identity(i).module), or
  // null without --offload; an R outside [1, blocks) is an error naming the flag.
  std::unique_ptr<pipelines::Stage> offload_stage(std::vector<std::string> block_modules, int cube_threads) const;
  // The stages for a run of `steps` steps over `blocks` blocks (pipelines/stage_plan.h's order and checks).
  static pipelines::StageList build(std::unique_ptr<pipelines::Stage> quantize, const pipelines::CacheConfig& cache, int steps, int blocks,
                                    std::unique_ptr<pipelines::SparseAttentionStage> sparse = nullptr,
                                    std::unique_ptr<pipelines::Stage> offload = nullptr);
};

std::shared_ptr<StageFlags> add_stage_flags(CLI::App& command);

// The stage rows of the run report on stderr: each stage's name, host seconds and summary; and the
// step counts (computed / skipped blocks and attention per step). The JSON form: pipelines/run_report.h.
void print_stage_report(const pipelines::StageList& stages);

}  // namespace cubevec::cli
