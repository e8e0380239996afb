// Suite `sparse`: MindIE SD's sparse attention (ops/sparse_attention.h).
//   kernel: one attention layer at S = 4680 (latent 6 x 26 x 30, 8 heads) and S = 32,760 (Wan2.1
//     832 x 480 x 81: latent 21 x 30 x 52; one head, to keep the suite in minutes), head dim 128,
//     f32: dense flash against rf_v2 and ada_bsa at sparsity 0, 0.5, 0.8 and 0.9 in the same
//     run. Rows: the sparse path (rf_v2's reorders included) with a given mask, its speedup over
//     dense flash, the kept fraction, GFLOP/s of the kept blocks and the fraction of the FMA peak;
//     the estimate alone, as a share of the sparse path's time.
//   quality: the tiny test Wan model (tests/data/wan_tiny, random weights) at 512 x 256, 17 frames
//     (latent 5 x 16 x 32 = 2,560 tokens, 20 key blocks), 20 steps: per algorithm and sparsity,
//     the cosine of each self-attention output against dense attention on the same q, k, v
//     (captured at step 10 of the dense run; worst and mean over the layers), and the PSNR of the
//     decoded video against the dense run.
// tools/plot_sparse.py draws speedup and PSNR against sparsity from the --json output.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "bench/harness.h"
#include "models/parameters.h"
#include "ops/sparse_attention.h"
#include "ops/vector_ops.h"
#include "pipelines/quality.h"
#include "pipelines/stages/sparse_attention.h"
#include "pipelines/wan_t2v.h"

namespace cubevec::bench {

namespace {

const double kSparsities[] = {0.0, 0.5, 0.8, 0.9};
const ops::SparseType kTypes[] = {ops::SparseType::rf_v2, ops::SparseType::ada_bsa};

Tensor random_bnsd(int64_t heads, int64_t s, int64_t d, unsigned seed) {
  models::ParameterTable t;
  Tensor x;
  t.add("x", {1, heads, s, d}, &x);
  models::make_random_parameters(t, DType::f32, seed, 1.0f);
  return x;
}

double kept_of(const ops::SparseMask& m) {
  return m.stats->ready && m.stats->total > 0 ? static_cast<double>(m.stats->kept) / static_cast<double>(m.stats->total)
                                              : m.expected_density;
}

void kernel_cases(Context& context, Device& device, const ops::LatentShape& latent, int64_t heads) {
  const Stream stream = device.default_stream();
  const int64_t s = latent[0] * latent[1] * latent[2], d = 128;
  const Tensor q = random_bnsd(heads, s, d, 1), k = random_bnsd(heads, s, d, 2), v = random_bnsd(heads, s, d, 3);
  const std::string shape = "S" + std::to_string(s) + " N" + std::to_string(heads) + " D128";
  const double dense_flops = 4.0 * static_cast<double>(heads) * static_cast<double>(s) * static_cast<double>(s) * static_cast<double>(d);
  const int runs = std::max(2, context.repeats / 2);
  ops::AttentionOptions dense_options;
  dense_options.layout = ops::AttentionLayout::bnsd;
  dense_options.opt_mode = ops::AttentionOptMode::manual;
  dense_options.op_type = ops::AttentionImpl::flash;
  const Timing dense = time_runs([&] { ops::attention_forward(q, k, v, dense_options, stream).data_ptr(); }, runs);
  Result base{"sparse", "kernel " + shape, "dense flash"};
  base.timing = dense;
  base.gflops = dense_flops / dense.median_s / 1e9;
  base.peak_fraction = base.gflops / context.machine.fma_peak_gflops;
  base.extra["kept"] = 1.0;
  context.add(base);
  for (const ops::SparseType type : kTypes)
    for (const double sparsity : kSparsities) {
      ops::SparseAttentionOptions o;
      o.sparse_type = type;
      o.sparsity = sparsity;
      o.latent_shape_q = latent;
      o.input_layout = ops::AttentionLayout::bnsd;
      ops::SparseMask mask;
      const Timing estimate = time_runs(
          [&] {
            mask = ops::estimate_sparse_mask(q, k, o, stream);
            stream.synchronize();
          },
          runs);
      // The kernel's own block mask picks the implementation once (runtime tuning), untimed.
      ops::sparse_attention_with_mask(q, k, v, mask, o, stream).data_ptr();
      const Timing sparse = time_runs([&] { ops::sparse_attention_with_mask(q, k, v, mask, o, stream).data_ptr(); }, runs);
      const double kept = kept_of(mask);
      Result row{"sparse", "kernel " + shape + " sparsity " + std::to_string(sparsity).substr(0, 3),
                 std::string(ops::sparse_type_name(type))};
      row.timing = sparse;
      row.gflops = kept * dense_flops / sparse.median_s / 1e9;
      row.peak_fraction = row.gflops / context.machine.fma_peak_gflops;
      row.extra["kept"] = kept;
      row.extra["speedup"] = dense.median_s / sparse.median_s;
      row.extra["estimate_ms"] = estimate.median_s * 1e3;
      row.extra["estimate_share"] = estimate.median_s / sparse.median_s;
      row.extra["speedup_with_estimate"] = dense.median_s / (sparse.median_s + estimate.median_s);
      context.add(row);
    }
}

// Records every self-attention call's q, k, v at one step (dense run).
class CaptureStage : public pipelines::Stage {
 public:
  explicit CaptureStage(int step) : step_(step) {}
  std::string name() const override { return "capture"; }
  bool uses_attention() const override { return true; }
  Tensor attend(const models::StepInfo& step, const models::AttentionIdentity& id, const models::AttentionProjection& project,
                const Stream& /*stream*/, const pipelines::AttendNext& next) override {
    if (step.index != step_ || id.kind != models::AttentionKind::self) return next(project);
    const models::AttentionQkv qkv = project();
    captured.push_back({id, qkv});
    return next([qkv] { return qkv; });
  }
  std::vector<std::pair<models::AttentionIdentity, models::AttentionQkv>> captured;

 private:
  int step_;
};

double cosine(const Tensor& a, const Tensor& b) {
  const Tensor x = ops::cast(a, DType::f32).contiguous(), y = ops::cast(b, DType::f32).contiguous();
  const float* p = x.data<float>();
  const float* q = y.data<float>();
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < x.numel(); ++i) ab += double(p[i]) * q[i], aa += double(p[i]) * p[i], bb += double(q[i]) * q[i];
  return ab / std::sqrt(std::max(aa * bb, 1e-300));
}

void quality_cases(Context& context, Device& device) {
  const std::string dir = std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/wan_tiny";
  const pipelines::WanT2VPipeline pipeline = pipelines::WanT2VPipeline::load(dir);
  pipelines::T2VOptions o;
  o.width = 512, o.height = 256, o.frames = 17, o.steps = 20, o.cfg = pipelines::CfgMode::off;
  models::ParameterTable inputs;
  Tensor text;
  inputs.add("prompt_embeds", {1, 7, pipeline.transformer().config().text_dim}, &text);
  models::make_random_parameters(inputs, DType::f32, 3, 1.0f);
  const models::PromptEmbeddings prompt{text, {}};
  const auto generate = [&](pipelines::StageList* stages) {
    pipelines::T2ITimings timings;
    const Tensor latents = pipeline.denoise(prompt, nullptr, o, device, {}, timings, stages);
    std::vector<Tensor> chunks;
    pipeline.decode(
        latents, o, device, [&](const Tensor& frames) { chunks.push_back(frames); }, timings);
    return std::make_pair(ops::concat(chunks, 2, device.default_stream()), timings.denoise_s);
  };
  pipelines::StageList capture_list;
  auto capture_owner = std::make_unique<CaptureStage>(o.steps / 2);
  CaptureStage& capture = *capture_owner;
  capture_list.add(std::move(capture_owner));
  const auto [dense_video, dense_s] = generate(&capture_list);
  Result base{"sparse", "tiny wan 2560 tokens dense", "dense"};
  base.timing = summarize({dense_s});
  base.extra["layers"] = static_cast<double>(capture.captured.size());
  context.add(base);
  for (const ops::SparseType type : kTypes)
    for (const double sparsity : kSparsities) {
      // Layer outputs on the dense run's q, k, v.
      double worst = 1, sum = 0;
      for (const auto& [id, qkv] : capture.captured) {
        ops::SparseAttentionOptions so;
        so.sparse_type = type;
        so.sparsity = sparsity;
        so.latent_shape_q = id.grid;
        so.input_layout = ops::AttentionLayout::bsnd;
        const double c = cosine(ops::sparse_attention(qkv.q, qkv.k, qkv.v, so, device.default_stream()).out,
                                ops::attention_forward(qkv.q, qkv.k, qkv.v, {}, device.default_stream()));
        worst = std::min(worst, c), sum += c;
      }
      pipelines::SparseConfig config;
      config.type = type;
      config.sparsity = sparsity;
      pipelines::StageList stages;
      auto stage_owner = std::make_unique<pipelines::SparseAttentionStage>(config);
      pipelines::SparseAttentionStage& stage = *stage_owner;
      stages.add(std::move(stage_owner));
      const auto [video, seconds] = generate(&stages);
      const pipelines::Quality q = pipelines::compare_pictures(video, dense_video);
      const std::vector<double> kept = stage.kept_fraction_per_step();
      double kept_mean = 0;
      for (double x : kept) kept_mean += x / static_cast<double>(kept.size());
      Result row{"sparse", "tiny wan 2560 tokens sparsity " + std::to_string(sparsity).substr(0, 3),
                 std::string(ops::sparse_type_name(type))};
      row.timing = summarize({seconds});
      row.extra["cosine_worst"] = worst;
      row.extra["cosine_mean"] = capture.captured.empty() ? 1.0 : sum / static_cast<double>(capture.captured.size());
      row.extra["psnr_db"] = std::isfinite(q.psnr_db) ? q.psnr_db : 999.0;
      row.extra["kept"] = kept_mean;
      context.add(row);
    }
}

}  // namespace

void sparse_suite(Context& context) {
  DeviceProfile profile = builtin_cpu_profile();
  profile.cube_threads = context.machine.threads;
  profile.vector_threads = context.machine.threads;
  Device device(profile);
  kernel_cases(context, device, {6, 26, 30}, 8);
  kernel_cases(context, device, {21, 30, 52}, 1);
  quality_cases(context, device);
}

}  // namespace cubevec::bench
