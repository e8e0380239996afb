// Suite `quant`: the int8 path against the float one, in the same run.
//   * the int8 GEMM (u8 x s8 -> s32, AMX-INT8 or VNNI) at the `gemm` shapes, GOP/s and the fraction
//     of its kernel's peak (AMX-INT8 or VNNI) measured in this run, beside cubevec's f32 and bf16 GEMMs and the per-token
//     activation quantization (the Vector kernel that feeds it) and the two fused (quantized as A is
//     packed, what a W8A8 Linear runs); then every int8 variant the
//     calibration weighs (each int8 kernel at each L2 share), the chosen one's impl ending in " *";
//   * one Flux double and one single block (the `blocks` shapes) with W8A16, W8A8_DYNAMIC and W8A8
//     against the f32 block;
//   * the shipped tinyflux with each algorithm, exported here from a calibration run on its
//     reference prompt: denoising time, weight bytes, and the picture's PSNR against float.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <tbb/task_arena.h>
#include <unistd.h>

#include "bench/harness.h"
#include "bench/quantized_block.h"
#include "models/flux_transformer.h"
#include "models/tiny_text_encoder.h"
#include "ops/gemm/tuner.h"
#include "ops/quantized.h"
#include "ops/vector_ops.h"
#include "pipelines/flux_t2i.h"
#include "pipelines/quality.h"
#include "pipelines/quant_export.h"
#include "pipelines/stages/quantize.h"
#include "quant/calibration.h"
#include "tensor/half.h"

namespace cubevec::bench {

namespace {

using quant::Algorithm;

Tensor random_matrix(int64_t rows, int64_t cols, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (float& x : v) x = dist(rng);
  return Tensor::from_vector(v, {rows, cols});
}

// Every int8 variant the calibration weighs on this shape, on the Cube unit's thread count, with the
// rate the calibration measured for it on its class's problem.
void int8_variant_rows(Context& context, const Device& device, const ops::QuantizedActivations& qa, const quant::QuantTensors& q,
                       const std::string& name, double ops_count, int runs) {
  namespace g = ops::gemm;
  const int threads = device.profile().cube_threads;
  tbb::task_arena arena(threads);
  const int64_t m = qa.data.size(0), n = q.weight.size(0), k = q.weight.size(1);
  const g::GemmTuneKey key{g::GemmFamily::int8, g::best_isa(), g::shape_class_of(m), threads};
  const g::GemmTuneEntry entry = arena.execute([&] { return g::GemmTuner::global().choose(key); });
  std::vector<float> c(static_cast<std::size_t>(m * n));
  std::shared_ptr<const g::PackedInt8> packed;
  for (const g::GemmVariant& variant : g::candidate_variants(key.family, key.isa)) {
    if (!packed || packed->isa != *variant.int8) packed = g::pack_int8_weight(q.weight.data<int8_t>(), n, k, k, *variant.int8);
    g::Int8Problem p;
    p.m = m, p.n = n, p.a = qa.data.data<uint8_t>(), p.lda = qa.data.size(1), p.b = packed.get(), p.c = c.data(), p.ldc = n;
    p.epilogue.row_scale = qa.row_scale.data<float>(), p.epilogue.col_scale = q.weight_scale.data<float>();
    const bool chosen = variant == entry.choice;
    Result r{"quant", "gemm " + name, "int8-" + variant.name() + (chosen ? " *" : "")};
    r.dtype = "i8";
    r.timing = arena.execute([&] { return time_runs([&] { g::gemm_int8_variant(p, threads, variant.l2_share); }, runs); });
    r.gflops = ops_count / r.timing.median_s / 1e9;
    const double peak = context.machine.int8_peak_gops(*variant.int8);
    r.peak_fraction = peak > 0 ? r.gflops / peak : 0;
    r.extra["chosen"] = chosen ? 1 : 0;
    for (const auto& rate : entry.considered)
      if (rate.variant == variant) r.extra["calibration_gops"] = rate.gflops;
    context.add(r);
  }
}

void gemm_cases(Context& context, Device& device) {
  const Stream s = device.default_stream();
  const int64_t shapes[][3] = {{4096, 3072, 3072}, {4096, 12288, 3072}, {4608, 9216, 3072}, {1024, 1024, 1024}, {256, 3072, 3072}};
  for (const auto& shape : shapes) {
    const int64_t m = shape[0], n = shape[1], k = shape[2];
    const std::string name = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    const double ops_count = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    const int runs = ops_count > 1e11 ? std::max(2, context.repeats / 2) : context.repeats;
    const Tensor a = random_matrix(m, k, 1), w = random_matrix(n, k, 2, 0.05f);
    const quant::QuantTensors q = quant::quantize_layer(w, {}, Algorithm::w8a8_dynamic, {});
    const ops::PackedInt8Weight packed = ops::pack_int8_weight(q.weight);
    const ops::QuantizedActivations qa = ops::quantize_activations(a, 4 * packed->k_quads, {}, s);
    qa.data.data_ptr();
    std::map<std::string, double> seconds;
    const auto row = [&](const std::string& impl, const std::string& dtype, const Timing& t, double peak) {
      Result r{"quant", "gemm " + name, impl};
      r.dtype = dtype;
      r.timing = t;
      r.gflops = ops_count / t.median_s / 1e9;
      r.peak_fraction = peak > 0 ? r.gflops / peak : 0;
      seconds[impl] = t.median_s;
      if (seconds.count("f32")) r.extra["x_f32"] = seconds["f32"] / t.median_s;
      context.add(r);
    };
    for (DType compute : {DType::f32, DType::bf16}) {
      const auto packed_float = ops::pack_weight(w, compute);
      const ops::MatmulOptions o{.b_is_weight = true, .compute = compute, .packed_weight = packed_float};
      row(compute == DType::f32 ? "f32" : "bf16", std::string(dtype_name(compute)),
          time_runs([&] { ops::matmul(a, w, o, s).data_ptr(); }, runs), context.machine.fma_peak_gflops);
    }
    row("int8 gemm", "i8", time_runs([&] { ops::matmul_int8(qa, packed, {.col_scale = q.weight_scale}, s).data_ptr(); }, runs),
        context.machine.int8_peak_gops(packed->isa));
    int8_variant_rows(context, device, qa, q, name, ops_count, runs);
    const Timing quantize = time_runs([&] { ops::quantize_activations(a, 4 * packed->k_quads, {}, s).data.data_ptr(); }, runs);
    Result r{"quant", "quantize per token " + std::to_string(m) + "x" + std::to_string(k), "vector"};
    r.timing = quantize;
    r.gbps = static_cast<double>(a.nbytes() + qa.data.nbytes()) / quantize.median_s / 1e9;
    r.peak_fraction = r.gbps / context.machine.triad_gbps;
    r.extra["share_of_int8_gemm"] = quantize.median_s / seconds["int8 gemm"];
    context.add(r);
    // What a W8A8_DYNAMIC Linear runs: the quantization fused into the GEMM's packing of A, against
    // the two kernels one after the other.
    const Timing fused = time_runs([&] { ops::matmul_int8_quantizing(a, {}, packed, {.col_scale = q.weight_scale}, s).data_ptr(); }, runs);
    Result f{"quant", "gemm " + name, "int8 gemm, quantize fused"};
    f.dtype = "i8";
    f.timing = fused;
    f.gflops = ops_count / fused.median_s / 1e9;
    f.peak_fraction = context.machine.int8_peak_gops(packed->isa) > 0 ? f.gflops / context.machine.int8_peak_gops(packed->isa) : 0;
    f.extra["x_quantize_then_gemm"] = (quantize.median_s + seconds["int8 gemm"]) / fused.median_s;
    f.extra["x_f32"] = seconds["f32"] / fused.median_s;
    context.add(f);
  }
}

void block_cases(Context& context, Device& device) {
  const Stream s = device.default_stream();
  const models::FluxConfig config = models::FluxConfig::flux1_dev();
  const int64_t d = config.inner_dim(), img = 1024, txt = 256;
  const Tensor hidden = random_matrix(img, d, 11).reshape({1, img, d}), context_states = random_matrix(txt, d, 12).reshape({1, txt, d});
  const Tensor silu = ops::activation(random_matrix(1, d, 13), ops::Activation::silu, s);
  const models::RopeTable t = models::axial_rope(Tensor::zeros({txt, 3}, DType::f32), config.axes_dims_rope);
  const models::RopeTable i = models::axial_rope(models::flux_image_ids(64, 64), config.axes_dims_rope);
  const models::RopeTable rope{ops::concat({t.cos, i.cos}, 0, s), ops::concat({t.sin, i.sin}, 0, s)};
  const models::FluxBlockInputs shared{silu, rope, {1, 32, 32}};
  for (const char* kind : {"double", "single"}) {
    std::map<std::string, double> seconds;
    for (const std::string scheme : {"f32", "W8A16", "W8A8_DYNAMIC", "W8A8"}) {
      models::ParameterTable table;
      models::FluxDoubleBlock double_block;
      models::FluxSingleBlock single_block;
      const bool is_double = std::string(kind) == "double";
      if (is_double) double_block.declare(table, 0, config);
      else single_block.declare(table, 0, config);
      models::make_random_parameters(table, DType::f32, 5, 0.02f);
      if (scheme != "f32") quantize_block(table, *quant::parse_algorithm(scheme, "bench"));
      const auto run = [&] {
        return is_double ? double_block.forward({hidden, context_states}, shared, {}, s).hidden
                         : single_block.forward({hidden, context_states}, shared, {}, s).hidden;
      };
      const Timing timing = time_runs([&] { run().data_ptr(); }, std::max(2, context.repeats / 2));
      Result r{"quant", std::string("flux ") + kind + " 1024+256 x3072", scheme};
      r.timing = timing;
      seconds[scheme] = timing.median_s;
      r.extra["x_f32"] = seconds["f32"] / timing.median_s;
      std::size_t bytes = 0;
      for (const auto& [name, linear] : table.linears()) bytes += linear->kernel ? linear->kernel->weight_bytes() : linear->weight.nbytes();
      r.extra["linear_weight_mb"] = static_cast<double>(bytes) / 1e6;
      context.add(r);
    }
  }
}

void tinyflux_cases(Context& context, Device& device) {
  const std::string dir = std::string(CUBEVEC_SOURCE_DIR) + "/assets/tinyflux";
  const auto encoder = models::TinyTextEncoder::load(dir, device.default_stream());
  const models::PromptEmbeddings prompt = encoder->encode("a red circle on a blue background");
  pipelines::T2IOptions o;
  o.width = o.height = 64;
  const std::filesystem::path files = std::filesystem::temp_directory_path() / ("cubevec_bench_quant_" + std::to_string(::getpid()));
  Tensor reference_picture;
  double reference_s = 0;
  for (const std::string scheme : {"f32", "W8A16", "W8A8_DYNAMIC", "W8A8", "W8A8_TIMESTEP"}) {
    pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(dir);
    std::string description;
    if (scheme != "f32") {
      // Export from one calibration run on the prompt, as `cubevec quantize` does.
      pipelines::QuantExportOptions e;
      e.algorithm = *quant::parse_algorithm(scheme, "bench");
      pipelines::StageList calibrate;
      auto stage = std::make_unique<pipelines::CalibrationStage>(e);
      pipelines::CalibrationStage& calibration = *stage;
      calibrate.add(std::move(stage));
      calibrate.after_load(pipeline.mutable_transformer().mutable_parameters());
      pipelines::T2ITimings t;
      pipeline.denoise(prompt, nullptr, o, device, {}, t, &calibrate);
      calibration.detach(pipeline.mutable_transformer().mutable_parameters());
      description = pipelines::export_quantized(pipeline.mutable_transformer().mutable_parameters(), calibration, e, o.steps,
                                                (files / scheme).string())
                        .description_path;
    }
    pipelines::StageList stages;
    std::size_t weight_bytes = 0;
    if (!description.empty()) {
      // W8A8_TIMESTEP with every step static: each step's own scales (MindIE's default policy
      // would make every step dynamic, the W8A8_DYNAMIC row).
      std::string policy;
      if (scheme == "W8A8_TIMESTEP") {
        policy = (files / "all_static.json").string();
        std::ofstream(policy) << R"({"default": "static"})";
      }
      auto quantize = std::make_unique<pipelines::QuantizeStage>(pipelines::QuantizeOptions{description, policy, false});
      pipelines::QuantizeStage& q = *quantize;
      stages.add(std::move(quantize));
      stages.after_load(pipeline.mutable_transformer().mutable_parameters());
      weight_bytes = q.int8_weight_bytes() + q.float_weight_bytes();
    } else {
      for (const auto& spec : pipeline.transformer().parameters().specs()) weight_bytes += spec.slot->nbytes();
    }
    std::vector<double> denoise_s;
    Tensor picture;
    for (int r = 0; r < std::max(3, context.repeats); ++r) {
      pipelines::T2ITimings t;
      const Tensor latents = pipeline.denoise(prompt, nullptr, o, device, {}, t, &stages);
      picture = pipeline.decode(latents, o, device, t);
      denoise_s.push_back(t.denoise_s);
    }
    Result row{"quant", "tinyflux 28 steps 64x64", scheme == "W8A8_TIMESTEP" ? "W8A8_TIMESTEP static" : scheme};
    row.timing = summarize(denoise_s);
    if (scheme == "f32")
      reference_picture = picture, reference_s = row.timing.median_s, row.extra["weight_mb"] = static_cast<double>(weight_bytes) / 1e6;
    else {
      const pipelines::Quality q = pipelines::compare_pictures(picture, reference_picture);
      row.extra["psnr_db"] = std::isfinite(q.psnr_db) ? q.psnr_db : 999.0;
      row.extra["max_abs"] = q.max_abs;
      row.extra["weight_mb"] = static_cast<double>(weight_bytes) / 1e6;
    }
    row.extra["speedup"] = reference_s / row.timing.median_s;
    context.add(row);
  }
  std::error_code ec;
  std::filesystem::remove_all(files, ec);
}

}  // namespace

void quant_suite(Context& context) {
  DeviceProfile profile = builtin_cpu_profile();
  profile.cube_threads = context.machine.threads;
  profile.vector_threads = context.machine.threads;
  Device device(profile);
  gemm_cases(context, device);
  block_cases(context, device);
  tinyflux_cases(context, device);
}

}  // namespace cubevec::bench
