#include "cli/stage_flags.h"
#include "cli/range_flag.h"

#include "pipelines/stage_plan.h"
#include "pipelines/stages/offload.h"

#include "pipelines/stages/quantize.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "base/error.h"

namespace cubevec::cli {

namespace {

const char* const kMindieFlags[] = {"--cache-step-start", "--cache-interval", "--cache-step-end", "--cache-block-start",
                                    "--cache-block-end"};
const char* const kDbFlags[] = {
    "--cache-fn", "--cache-bn", "--cache-threshold", "--cache-warmup", "--cache-max-cached", "--cache-max-continuous", "--taylorseer"};

}  // namespace

std::shared_ptr<StageFlags> add_stage_flags(CLI::App& command) {
  auto f = std::make_shared<StageFlags>();
  auto& v = f->values;
  auto add = [&](const char* name, auto& target, const char* help) { f->options.push_back(command.add_option(name, target, help)); };
  add("--quant", f->quant,
      "MindIE SD quant description (quant_model_description_*.json; its weight file beside it); in --simulate "
      "also an algorithm name (W8A16, W8A8, W8A8_DYNAMIC, W8A8_TIMESTEP)");
  add("--quant-2", f->quant_2,
      "Two experts (Wan2.2 A14B): transformer_2/'s quant description (--quant then describes transformer/); cubevec quantize "
      "writes it into its --out folder's transformer_2/");
  add("--timestep-policy", f->timestep_policy, "W8A8_TIMESTEP: JSON {\"default\": \"dynamic\", \"static\": [steps...]}");
  add("--cache", f->cache,
      "Step cache: none, attention (MindIE AttentionCache), dit-block (MindIE DiTBlockCache), db (cache-dit DBCache/FBCache)");
  add("--cache-config", f->cache_config, "JSON file with the cache settings (the flags' names without the dashes as keys)");
  add("--cache-step-start", v.step_start, "attention / dit-block: first step that may use the cache (default 0)");
  add("--cache-interval", v.step_interval, "attention / dit-block: compute every N steps from the start (default 1: bypass)");
  add("--cache-step-end", f->step_end, "attention: last step that may reuse (default: the last step)");
  add("--cache-block-start", v.block_start, "attention / dit-block: first block of the cached span (default 0)");
  add("--cache-block-end", f->block_end, "attention / dit-block: end of the span, exclusive (default: all blocks)");
  add("--cache-fn", v.fn, "db: blocks always computed first (default 8; 1 is FBCache)");
  add("--cache-bn", v.bn, "db: blocks always computed last (default 0)");
  add("--cache-threshold", v.threshold, "db: residual difference below which a step is cached (default 0.08)");
  add("--cache-warmup", v.warmup, "db: steps always computed first (default 8)");
  add("--cache-max-cached", v.max_cached, "db: most steps cached in a run (default -1: no limit)");
  add("--cache-max-continuous", v.max_continuous, "db: most steps cached in a row (default -1: no limit)");
  add("--taylorseer", v.taylorseer, "db: extrapolate the skipped residual with TaylorSeer of order 1 or 2");
  auto& sv = f->sparse_values;
  add("--sparse", f->sparse, "Sparse attention: none, rf_v2 (RainFusion 2.0), ada_bsa (MindIE SD's sparse_attention)");
  add("--sparsity", sv.sparsity, "Sparse attention: the fraction of blocks to skip, in [0, 1] (default 0.5)");
  add("--sparse-step-start", sv.step_start, "Sparse attention: dense before this step (default 0)");
  add("--sparse-blocks", f->sparse_blocks, "Sparse attention: the blocks A-B (B included) that run sparse (default: all)");
  add("--sparse-mask-refresh", sv.mask_refresh, "Sparse attention: estimate new masks every K steps, reuse them between (default 1)");
  add("--sparse-cdf-threshold", sv.cdf_threshold, "ada_bsa: keep the blocks holding this share of the estimated mass, (0, 1] (default 1)");
  add("--quant-attention", f->quant_attention,
      "Attention in low precision: none (the autotuner's exact kernels), int8 (Q K^T in int8 on AMX-INT8 or AVX512-VNNI, K smoothed by its "
      "mean as "
      "SageAttention does: lossy)");
  f->options.push_back(command
                           .add_option("--offload", f->offload,
                                       "Weight streaming: blocks 0..R-1 stay packed, block i+R is packed on a copy thread while block "
                                       "i computes, later blocks are let go after use (default 0: every weight resident)")
                           ->check(in_range(0, 1 << 20)));
  return f;
}

pipelines::CacheConfig StageFlags::cache_settings() const {
  auto given = [&](const char* name) {
    for (const CLI::Option* o : options)
      if (o->check_name(name)) return o->count() > 0;
    return false;
  };
  pipelines::CacheConfig c;
  if (!cache_config.empty()) {
    c = pipelines::CacheConfig::load(cache_config);
    if (given("--cache") && pipelines::parse_cache_method(cache) != c.method)
      throw Error("--cache " + cache + " contradicts --cache-config " + cache_config + ", which says \"" +
                  std::string(pipelines::cache_method_name(c.method)) + "\"");
  } else {
    c.method = pipelines::parse_cache_method(cache);
  }
  const bool mindie = c.method == pipelines::CacheMethod::attention || c.method == pipelines::CacheMethod::dit_block;
  for (const char* name : kMindieFlags)
    if (given(name) && !mindie)
      throw Error(std::string(name) + " applies to --cache attention and --cache dit-block, not --cache " +
                  std::string(pipelines::cache_method_name(c.method)));
  for (const char* name : kDbFlags)
    if (given(name) && c.method != pipelines::CacheMethod::db)
      throw Error(std::string(name) + " applies to --cache db, not --cache " + std::string(pipelines::cache_method_name(c.method)));
  if (given("--cache-step-start")) c.step_start = values.step_start;
  if (given("--cache-interval")) c.step_interval = values.step_interval;
  if (given("--cache-step-end")) c.step_end = step_end;
  if (given("--cache-block-start")) c.block_start = values.block_start;
  if (given("--cache-block-end")) c.block_end = block_end;
  if (given("--cache-fn")) c.fn = values.fn;
  if (given("--cache-bn")) c.bn = values.bn;
  if (given("--cache-threshold")) c.threshold = values.threshold;
  if (given("--cache-warmup")) c.warmup = values.warmup;
  if (given("--cache-max-cached")) c.max_cached = values.max_cached;
  if (given("--cache-max-continuous")) c.max_continuous = values.max_continuous;
  if (given("--taylorseer")) c.taylorseer = values.taylorseer;
  return c;
}

bool StageFlags::quant_given() const {
  return std::any_of(options.begin(), options.end(), [](const CLI::Option* o) { return o->check_name("--quant") && o->count() > 0; });
}

std::unique_ptr<pipelines::Stage> StageFlags::quantize_stage(bool simulate, int steps) const {
  if (!quant_given()) {
    if (!timestep_policy.empty()) throw Error("--timestep-policy applies with --quant (a W8A8_TIMESTEP description)");
    return nullptr;
  }
  return std::make_unique<pipelines::QuantizeStage>(pipelines::QuantizeOptions{quant, timestep_policy, simulate, steps, quant_2});
}

std::unique_ptr<pipelines::SparseAttentionStage> StageFlags::sparse_stage() const {
  const auto given = [&](const char* name) {
    return std::any_of(options.begin(), options.end(), [&](const CLI::Option* o) { return o->check_name(name) && o->count() > 0; });
  };
  pipelines::SparseConfig c = sparse_values;
  c.type = ops::parse_sparse_type(sparse);
  if (c.type == ops::SparseType::none) {
    for (const char* name : {"--sparsity", "--sparse-step-start", "--sparse-blocks", "--sparse-mask-refresh", "--sparse-cdf-threshold"})
      if (given(name)) throw Error(std::string(name) + " applies with --sparse rf_v2|ada_bsa");
    return nullptr;
  }
  if (given("--sparse-cdf-threshold") && c.type != ops::SparseType::ada_bsa)
    throw Error("--sparse-cdf-threshold applies with --sparse ada_bsa");
  if (!sparse_blocks.empty()) std::tie(c.block_first, c.block_last) = pipelines::SparseConfig::parse_blocks(sparse_blocks);
  return std::make_unique<pipelines::SparseAttentionStage>(c);
}

std::unique_ptr<pipelines::Stage> StageFlags::offload_stage(std::vector<std::string> block_modules, int cube_threads) const {
  if (offload == 0) return nullptr;
  return std::make_unique<pipelines::OffloadStage>(offload, std::move(block_modules), cube_threads);
}

pipelines::StageList StageFlags::build(std::unique_ptr<pipelines::Stage> quantize, const pipelines::CacheConfig& cache_config, int steps,
                                       int blocks, std::unique_ptr<pipelines::SparseAttentionStage> sparse,
                                       std::unique_ptr<pipelines::Stage> offload) {
  return pipelines::build_stage_list(std::move(quantize), cache_config, steps, blocks, std::move(sparse), std::move(offload));
}

void print_stage_report(const pipelines::StageList& stages) {
  for (std::size_t i = 0; i < stages.stages().size(); ++i) {
    const auto& stage = stages.stages()[i];
    std::fprintf(stderr, "%-28s %10.3f   (%s)\n", stage->name().c_str(), stages.stage_seconds(i), stage->summary().c_str());
  }
  pipelines::StepCounts total;
  for (const auto& c : stages.step_counts()) {
    total.block_calls += c.block_calls;
    total.blocks_computed += c.blocks_computed;
    total.attention_calls += c.attention_calls;
    total.attention_computed += c.attention_computed;
  }
  if (!stages.empty()) std::fprintf(stderr, "stages: %s over the run\n", pipelines::StageList::skipped_text(total).c_str());
}

}  // namespace cubevec::cli
