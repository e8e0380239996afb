// Suite `blocks`: one Flux double block and one single block at FLUX.1 width (3072 hidden, 24
// heads x 128) on 1024 image + 256 text tokens, and one Wan2.1 block at the 1.3B model's width
// (1536 hidden, 12 heads x 128, FFN 8960) and one at Wan2.2-TI2V-5B's (3072 hidden, 24 heads, FFN 14336) on a 4,680-token video (13 latent frames of 18 x 20
// patches) with 512 text tokens; f32, bf16 weights, and bf16 weights + activations, each with its per-op breakdown (measured
// kernel time by kernel name), and the same blocks in PyTorch 1.13 on CPU measured in the same run
// by bench/torch_flux_blocks.py and bench/torch_wan_blocks.py (Debian's /usr/bin/python3; skipped
// with a note when torch is not installed). GFLOP/s count every kernel's declared FLOPs; the
// fraction is of the measured 2-thread FMA peak. Per block, a best-path pair (issue 41): "cubevec-best"
// (W8A8_DYNAMIC + bf16 activations where the CPU multiplies bf16 in hardware, else f32 activations;
// exact or, where the CPU has it and the output keeps a cosine of 0.999, int8 attention, whichever
// is faster; its output's cosine against the f32 block) and "torch-best" (PyTorch's faster of f32 and bf16 in
// the same run; f32 only on CPUs without bf16 hardware, see bench/torch_bench_common.py).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench/block_inputs.h"
#include "bench/harness.h"
#include "bench/quantized_block.h"
#include "bench/torch_baseline.h"
#include "bench/traced_run.h"
#include "models/flux_transformer.h"
#include "models/forward_context.h"
#include "models/wan_transformer.h"
#include "ops/attention.h"
#include "ops/gemm/driver.h"
#include "pipelines/stages/quant_attention.h"
#include "ops/vector_ops.h"
#include "quant/algorithm.h"

namespace cubevec::bench {

namespace {

// f32; bf16 weights with f32 activations; bf16 weights and activations (what --dtype bf16 runs, and
// what PyTorch's bf16 block does).
struct Precision {
  const char* name;
  DType weights, activations;
};
constexpr Precision kPrecisions[] = {
    {"f32", DType::f32, DType::f32}, {"bf16-weights", DType::bf16, DType::f32}, {"bf16", DType::bf16, DType::bf16}};

// The block's row (with x PyTorch when the baseline ran), its per-op rows largest first, and the
// PyTorch row.
void report(Context& context, const std::string& label, const std::string& block, const std::string& dt, const TracedRun& run,
            const nlohmann::json& torch) {
  const std::string torch_dt = dt == "f32" ? "f32" : "bf16";  // PyTorch's bf16 block has bf16 weights and activations
  Result r{"blocks", label, "cubevec"};
  r.dtype = dt;
  r.timing = run.timing;
  r.gflops = run.flops / run.timing.median_s / 1e9;
  r.peak_fraction = r.gflops / context.machine.fma_peak_gflops;
  const nlohmann::json* baseline = nullptr;
  if (!torch.is_null())
    for (const auto& t : torch["results"])
      if (t["block"] == block && t["dtype"] == torch_dt) baseline = &t;
  if (baseline) r.extra["x_torch"] = (*baseline)["median_s"].get<double>() / run.timing.median_s;
  context.add(r);
  std::vector<std::pair<double, std::string>> ops;
  double total = 0;
  for (const auto& [name, sec] : run.op_s) {
    ops.push_back({sec, name});
    total += sec;
  }
  std::sort(ops.rbegin(), ops.rend());
  for (const auto& [sec, name] : ops) {
    Result op{"blocks", "  " + block + " op", name};
    op.dtype = dt;
    op.timing = summarize({sec});
    op.extra["share"] = sec / total;
    context.add(op);
  }
  if (baseline && dt != "bf16-weights") {
    Result t{"blocks", label, "pytorch-" + torch["torch_version"].get<std::string>()};
    t.dtype = torch_dt;
    t.timing = summarize((*baseline)["runs_s"].get<std::vector<double>>());
    context.add(t);
  }
}

// The best-path pair of rows (issue 41): cubevec's fastest path, W8A8_DYNAMIC Linears on the CPU's
// fastest int8 kernel with bf16 activations (the attention autotuned, flash_bf16 where the CPU
// has AMX), with its output's cosine against the f32 block; and PyTorch's faster of f32 and bf16
// from the same run.
// The best path's activations: bf16 where AMX-BF16 or AVX512-BF16 multiply it (the bf16 flash
// tiles), else f32 (without bf16 hardware every bf16 operand is widened to f32 first).
DType best_activations() { return ops::gemm::amx_ready() || ops::gemm::has_bf16_dot() ? DType::bf16 : DType::f32; }

// The attention of a best path that asks for int8: what --quant-attention int8 runs.
class Int8Attention final : public models::AttentionPolicy {
 public:
  Tensor attend(const models::StepInfo& /*step*/, const models::AttentionIdentity& /*id*/, const models::AttentionProjection& project,
                const Stream& stream) override {
    return pipelines::int8_attention(project(), stream);
  }
};

constexpr double kBestCosine = 0.999;  // the bound for a best path's block output

struct BestPath {
  Timing timing;
  double cosine = 0;
  bool int8_attention = false;
};

// The best path of a quantized block: `forward(ctx)` with exact attention (the autotuner's
// kernels) and, where the CPU has flash_int8, with int8 attention; the faster of those whose
// output keeps kBestCosine against `reference` (exact attention's is reported whatever it is).
template <class Forward>
BestPath best_path(const Context& context, const Forward& forward, const Tensor& reference, DType act, const Stream& s) {
  const int runs = std::max(2, context.repeats / 2);
  const models::ForwardContext exact{.activations = act};
  BestPath best{time_runs([&] { forward(exact).data_ptr(); }, runs), output_cosine(forward(exact), reference, s), false};
  if (ops::attention_impl_available(ops::AttentionImpl::flash_int8)) {
    Int8Attention int8;
    const models::ForwardContext quantized{.attention = &int8, .activations = act};
    const double cos = output_cosine(forward(quantized), reference, s);
    if (cos >= kBestCosine) {
      const Timing t = time_runs([&] { forward(quantized).data_ptr(); }, runs);
      if (t.median_s < best.timing.median_s) best = {t, cos, true};
    }
  }
  return best;
}

void best_rows(Context& context, const std::string& label, const std::string& block, const BestPath& path, const nlohmann::json& torch) {
  const Timing& best = path.timing;
  const double cos = path.cosine;
  const nlohmann::json* fastest = nullptr;
  if (!torch.is_null())
    for (const auto& t : torch["results"])
      if (t["block"] == block && (!fastest || t["median_s"].get<double>() < (*fastest)["median_s"].get<double>())) fastest = &t;
  Result r{"blocks", label, "cubevec-best"};
  r.dtype = std::string("w8a8+") + std::string(dtype_name(best_activations())) + (path.int8_attention ? "+int8attn" : "");
  r.extra["int8_attention"] = path.int8_attention ? 1 : 0;
  r.timing = best;
  r.extra["cosine"] = cos;
  r.extra["one_minus_cosine"] = 1.0 - cos;  // the table prints 3 digits: 0.99994 would read as 1
  if (fastest) r.extra["x_torch_best"] = (*fastest)["median_s"].get<double>() / best.median_s;
  context.add(r);
  if (!fastest) return;
  Result t{"blocks", label, "torch-best"};
  t.dtype = (*fastest)["dtype"].get<std::string>();
  t.timing = summarize((*fastest)["runs_s"].get<std::vector<double>>());
  context.add(t);
}

// One Wan block of `config`'s width on the video sequence, f32 and bf16 weights.
void wan_block(Context& context, Device& device, const nlohmann::json& torch, const models::WanConfig& config, const std::string& label) {
  const Stream s = device.default_stream();
  const WanBlockInputsF32 in = wan_block_inputs(config);
  const Tensor &hidden = in.hidden, &context_states = in.context_states, &timestep_proj = in.timestep_proj;
  const models::RopeTable& rope = in.rope;
  for (const Precision& precision : kPrecisions) {
    models::ParameterTable table;
    models::WanBlock block;
    block.declare(table, 0, config);
    models::make_random_parameters(table, precision.weights, 7, 0.02f);
    const models::ForwardContext ctx{.activations = precision.activations};
    const models::WanBlockInputs shared{ops::cast(context_states, precision.activations, s),
                                        ops::cast(timestep_proj, precision.activations, s),
                                        rope,
                                        {kWanFrames, kWanHeight, kWanWidth}};
    const Tensor h = ops::cast(hidden, precision.activations, s);
    const TracedRun run = measure_traced(
        device,
        [&] {
          return block.forward({h, {}}, shared, ctx, s).hidden;
        },
        context.repeats);
    report(context, label, "wan", precision.name, run, torch);
  }
  // The best path against the f32 block with the same weights.
  models::ParameterTable table;
  models::WanBlock block;
  block.declare(table, 0, config);
  models::make_random_parameters(table, DType::f32, 7, 0.02f);
  const models::WanBlockInputs f32_inputs{context_states, timestep_proj, rope, {kWanFrames, kWanHeight, kWanWidth}};
  const Tensor reference = block.forward({hidden, {}}, f32_inputs, {}, s).hidden;
  quantize_block(table, quant::Algorithm::w8a8_dynamic);
  const DType act = best_activations();
  const models::WanBlockInputs inputs{
      ops::cast(context_states, act, s), ops::cast(timestep_proj, act, s), rope, {kWanFrames, kWanHeight, kWanWidth}};
  const Tensor h = ops::cast(hidden, act, s);
  const auto forward = [&](const models::ForwardContext& ctx) { return block.forward({h, {}}, inputs, ctx, s).hidden; };
  best_rows(context, label, "wan", best_path(context, forward, reference, act, s), torch);
}

}  // namespace

void blocks_suite(Context& context) {
  const int threads = context.machine.threads;
  const nlohmann::json torch = run_torch("torch_flux_blocks.py", threads, std::max(2, context.repeats / 2));
  const nlohmann::json torch_wan = run_torch("torch_wan_blocks.py", threads, std::max(2, context.repeats / 2));
  if (torch.is_null() || torch_wan.is_null()) std::fprintf(stderr, "note: a PyTorch baseline did not run (needs Debian's python3-torch)\n");

  DeviceProfile profile = builtin_cpu_profile();
  profile.cube_threads = threads;
  profile.vector_threads = threads;
  Device device(profile, {.trace = true});
  const Stream s = device.default_stream();
  const models::FluxConfig config = models::FluxConfig::flux1_dev();
  const FluxBlockInputsF32 in = flux_block_inputs(config, s);
  const Tensor &hidden = in.hidden, &context_states = in.context_states, &silu = in.silu_temb;
  const models::RopeTable& rope = in.rope;

  for (const Precision& precision : kPrecisions) {
    models::ParameterTable table;
    models::FluxDoubleBlock double_block;
    models::FluxSingleBlock single_block;
    double_block.declare(table, 0, config);
    single_block.declare(table, 0, config);
    models::make_random_parameters(table, precision.weights, 5, 0.02f);
    const DType act = precision.activations;
    const models::ForwardContext ctx{.activations = act};
    const models::FluxBlockInputs shared{ops::cast(silu, act, s), rope, {1, 32, 32}};
    const models::BlockState state{ops::cast(hidden, act, s), ops::cast(context_states, act, s)};
    const TracedRun runs[2] = {measure_traced(
                                   device, [&] { return double_block.forward(state, shared, ctx, s).hidden; }, context.repeats),
                               measure_traced(
                                   device, [&] { return single_block.forward(state, shared, ctx, s).hidden; }, context.repeats)};
    const char* names[2] = {"double", "single"};
    for (int b = 0; b < 2; ++b)
      report(context, std::string("flux ") + names[b] + " 1024+256 x3072", names[b], precision.name, runs[b], torch);
  }
  // The best path: the f32 weights of the f32 rows quantized, bf16 activations where they pay.
  {
    models::ParameterTable table;
    models::FluxDoubleBlock double_block;
    models::FluxSingleBlock single_block;
    double_block.declare(table, 0, config);
    single_block.declare(table, 0, config);
    models::make_random_parameters(table, DType::f32, 5, 0.02f);
    const models::FluxBlockInputs f32_shared{silu, rope, {1, 32, 32}};
    const Tensor reference[2] = {double_block.forward({hidden, context_states}, f32_shared, {}, s).hidden,
                                 single_block.forward({hidden, context_states}, f32_shared, {}, s).hidden};
    quantize_block(table, quant::Algorithm::w8a8_dynamic);
    const DType act = best_activations();
    const models::FluxBlockInputs shared{ops::cast(silu, act, s), rope, {1, 32, 32}};
    const models::BlockState state{ops::cast(hidden, act, s), ops::cast(context_states, act, s)};
    const char* names[2] = {"double", "single"};
    for (int b = 0; b < 2; ++b) {
      const auto forward = [&](const models::ForwardContext& ctx) {
        return b == 0 ? double_block.forward(state, shared, ctx, s).hidden : single_block.forward(state, shared, ctx, s).hidden;
      };
      best_rows(context, std::string("flux ") + names[b] + " 1024+256 x3072", names[b], best_path(context, forward, reference[b], act, s),
                torch);
    }
  }
  wan_block(context, device, torch_wan, models::WanConfig::wan21_1_3b(), "wan 4680+512 x1536");
  // Wan2.2-TI2V-5B's block (3072 wide, 24 heads x 128, FFN 14336) on the same video.
  const nlohmann::json torch_wan22 =
      run_torch("torch_wan_blocks.py", threads, std::max(2, context.repeats / 2), "--hidden 3072 --heads 24 --ffn 14336");
  wan_block(context, device, torch_wan22, models::WanConfig::wan22_5b(), "wan2.2-5b 4680+512 x3072");
}

}  // namespace cubevec::bench
