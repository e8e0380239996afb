#include "pipelines/stages/sparse_attention.h"

#include <cmath>
#include <cstdio>

#include "base/error.h"

namespace cubevec::pipelines {

namespace {

std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}

}  // namespace

void SparseConfig::validate() const {
  if (!std::isfinite(sparsity) || sparsity < 0.0 || sparsity > 1.0) throw Error("--sparsity must be in [0, 1], got " + number(sparsity));
  if (type == ops::SparseType::rf_v2 && sparsity >= 1.0)
    throw Error("--sparsity must be below 1 for rf_v2 (it keeps ceil(L * (1 - sparsity)) blocks per row), got " + number(sparsity));
  if (step_start < 0) throw Error("--sparse-step-start must be >= 0, got " + std::to_string(step_start));
  if (mask_refresh < 1) throw Error("--sparse-mask-refresh must be >= 1 (1: a new mask every step), got " + std::to_string(mask_refresh));
  if (block_first < 0 || (block_last >= 0 && block_last < block_first))
    throw Error("--sparse-blocks must be A-B with 0 <= A <= B, got " + std::to_string(block_first) + "-" + std::to_string(block_last));
  if (!std::isfinite(cdf_threshold) || cdf_threshold <= 0.0 || cdf_threshold > 1.0)
    throw Error("--sparse-cdf-threshold must be in (0, 1], got " + number(cdf_threshold));
}

std::pair<int, int> SparseConfig::parse_blocks(const std::string& text) {
  const auto dash = text.find('-');
  const auto parse = [&](const std::string& part) {
    if (part.empty() || part.size() > 6 || part.find_first_not_of("0123456789") != std::string::npos)
      throw Error("--sparse-blocks must be A-B (block indices, B included), got '" + text + "'");
    return std::stoi(part);
  };
  if (dash == std::string::npos) throw Error("--sparse-blocks must be A-B (block indices, B included), got '" + text + "'");
  const int a = parse(text.substr(0, dash)), b = parse(text.substr(dash + 1));
  if (b < a) throw Error("--sparse-blocks " + text + ": the last block comes before the first");
  return {a, b};
}

SparseAttentionStage::SparseAttentionStage(SparseConfig config) : config_(config) { config_.validate(); }

std::string SparseAttentionStage::name() const {
  return "sparse " + std::string(ops::sparse_type_name(config_.type)) + " " + number(config_.sparsity);
}

void SparseAttentionStage::check_blocks(int blocks) const {
  const int last = config_.block_last < 0 ? blocks - 1 : config_.block_last;
  if (config_.block_first >= blocks || last >= blocks)
    throw Error("--sparse-blocks " + std::to_string(config_.block_first) + "-" + std::to_string(last) + " must lie in 0-" +
                std::to_string(blocks - 1) + " (this model has " + std::to_string(blocks) + " blocks)");
}

void SparseAttentionStage::check_steps(int steps) const {
  if (config_.step_start >= steps)
    throw Error("--sparse-step-start " + std::to_string(config_.step_start) + " must be below the step count " + std::to_string(steps) +
                " (steps from it on run sparse; none would)");
}

void SparseAttentionStage::begin_run(const RunInfo& run) {
  check_blocks(run.blocks);
  run_ = run;
  block_last_ = config_.block_last < 0 ? run.blocks - 1 : config_.block_last;
  masks_.clear();
  uses_.assign(static_cast<std::size_t>(std::max(run.steps, 0)), {});
  estimates_per_step_.assign(uses_.size(), 0);
  estimates_ = sparse_calls_ = 0;
}

void SparseAttentionStage::restart(const RunInfo&) { masks_.clear(); }

void SparseAttentionStage::before_step(const models::StepInfo& step) {
  if (step.index >= static_cast<int>(uses_.size())) {
    uses_.resize(static_cast<std::size_t>(step.index) + 1);
    estimates_per_step_.resize(uses_.size(), 0);
  }
}

bool SparseAttentionStage::refreshes(int step) const {
  return step >= config_.step_start && (step - config_.step_start) % config_.mask_refresh == 0;
}

Tensor SparseAttentionStage::attend(const models::StepInfo& step, const models::AttentionIdentity& id,
                                    const models::AttentionProjection& project, const Stream& stream, const AttendNext& next) {
  if (id.kind == models::AttentionKind::cross || step.index < config_.step_start || id.block < config_.block_first ||
      id.block > block_last_)
    return next(project);
  const models::AttentionQkv qkv = project();  // BSND
  ops::SparseAttentionOptions o;
  o.sparse_type = config_.type;
  o.sparsity = config_.sparsity;
  o.txt_len = id.kind == models::AttentionKind::joint ? id.text_len : 0;
  o.latent_shape_q = id.grid;
  o.input_layout = ops::AttentionLayout::bsnd;
  o.cdf_threshold = config_.cdf_threshold;
  o.keep_sink = config_.keep_sink;
  o.keep_recent = config_.keep_recent;
  const auto key = std::make_pair(step.branch, id.module);
  auto found = masks_.find(key);
  // A new mask on refresh steps, and whenever this module has none yet (e.g. a CFG branch that
  // first runs after the refresh step).
  if (found == masks_.end() || refreshes(step.index)) {
    found = masks_.insert_or_assign(key, ops::estimate_sparse_mask(qkv.q, qkv.k, o, stream)).first;
    ++estimates_;
    ++estimates_per_step_[static_cast<std::size_t>(step.index)];
    if (note_.empty()) note_ = found->second.note;
  }
  ++sparse_calls_;
  uses_[static_cast<std::size_t>(step.index)].push_back({found->second.stats, found->second.expected_density});
  const Tensor out = ops::sparse_attention_with_mask(qkv.q, qkv.k, qkv.v, found->second, o, stream);
  return out.reshape({out.size(0), out.size(1), out.size(2) * out.size(3)});
}

std::vector<double> SparseAttentionStage::kept_fraction_per_step() const {
  std::vector<double> out;
  for (const auto& step : uses_) {
    if (step.empty()) {
      out.push_back(-1.0);
      continue;
    }
    double sum = 0;
    for (const Use& u : step)
      sum += u.stats->ready && u.stats->total > 0 ? static_cast<double>(u.stats->kept) / static_cast<double>(u.stats->total) : u.expected;
    out.push_back(sum / static_cast<double>(step.size()));
  }
  return out;
}

std::string SparseAttentionStage::summary() const {
  const std::vector<double> kept = kept_fraction_per_step();
  double sum = 0;
  int steps = 0;
  for (double k : kept)
    if (k >= 0) sum += k, ++steps;
  char text[256];
  std::snprintf(text, sizeof text,
                "%d sparse attention calls from step %d, blocks %d-%d, %d mask estimates (every %d steps); kept %.1f%% of the blocks%s",
                sparse_calls_, config_.step_start, config_.block_first, block_last_, estimates_, config_.mask_refresh,
                steps ? 100.0 * sum / steps : 100.0, run_.simulate ? " (modelled from the shapes)" : "");
  return std::string(text) + (note_.empty() ? "" : "; " + note_);
}

nlohmann::ordered_json SparseAttentionStage::report() const {
  nlohmann::ordered_json per_step = nlohmann::ordered_json::array();
  for (double k : kept_fraction_per_step()) per_step.push_back(k < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(k));
  return {{"sparse_type", std::string(ops::sparse_type_name(config_.type))},
          {"sparsity", config_.sparsity},
          {"step_start", config_.step_start},
          {"blocks", {config_.block_first, block_last_}},
          {"mask_refresh", config_.mask_refresh},
          {"cdf_threshold", config_.cdf_threshold},
          {"sparse_calls", sparse_calls_},
          {"mask_estimates", estimates_},
          {"mask_estimates_per_step", estimates_per_step_},
          {"kept_fraction_per_step", per_step}};
}

}  // namespace cubevec::pipelines
