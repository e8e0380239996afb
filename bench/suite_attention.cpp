// Suite `attention`: attention_forward's implementations at DiT shapes, GFLOP/s counted as
// 4 * B * N * Sq * Sk * D. Rows:
//   flash-2t       tiled flash on a Cube unit with both cores
//   flash-1t       tiled flash on a Cube unit with one core (the single-unit baseline)
//   cv_pipelined   Cube core + Vector core (pinned), QK^T/PV and softmax overlapped
//   flash_bf16     bf16 inputs only, where the CPU has AMX-BF16 or AVX512-BF16: the products in bf16
//                  on both cores, x_flash_f32 its speed against flash-2t on the same shape's f32
//                  inputs (the issue-41 target: >= 2x) and of_amx_peak its fraction of the AMX-BF16 peak
//   flash_int8     bf16 inputs only, where the CPU has AMX-INT8 (or AVX512-VNNI with AVX512-BF16):
//                  Q K^T in int8 (SageAttention's
//                  scheme), P V in bf16; x_flash_bf16 its speed against flash_bf16 and cosine its
//                  output against flash's (f32 products) on the same inputs
//   math           materialized scores (only where they fit comfortably: S <= 1280)
//   runtime        opt_mode runtime on the 2-core device: the autotuner's pick (named in the row)
// Fractions are of the 2-thread FMA peak (1t rows also state their fraction of the 1-thread peak).
#include <random>

#include "bench/harness.h"
#include "bench/quantized_block.h"
#include "ops/attention.h"
#include "ops/attention/cv_pipeline.h"
#include "ops/attention_tuner.h"
#include "tensor/half.h"

namespace cubevec::bench {

namespace {

struct Shape4 {
  std::string name;
  int64_t batch, sq, sk, heads, d;
};

Tensor random_bsnd(int64_t b, int64_t s, int64_t n, int64_t d, DType dtype, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(b * s * n * d));
  for (float& x : v) x = dist(rng);
  Tensor t = Tensor::from_vector(v, {b, s, n, d});
  if (dtype == DType::f32) return t;
  Tensor out = Tensor::empty(t.shape(), DType::bf16);
  convert_f32_to_bf16(t.data<float>(), out.mutable_data<uint16_t>(), v.size());
  return out;
}

}  // namespace

void attention_suite(Context& context) {
  DeviceProfile two = builtin_cpu_profile();
  two.cube_threads = context.machine.threads;
  two.vector_threads = 1;
  DeviceProfile split = builtin_cpu_profile();
  split.cube_threads = 1;
  split.vector_threads = 1;
  split.pin_units = true;
  Device device_two(two), device_split(split);
  const Stream stream_two = device_two.new_stream("attention"), stream_split = device_split.new_stream("attention");

  const std::vector<Shape4> shapes = {
      {"self S1280 24x128", 1, 1280, 1280, 24, 128},
      {"self S4608 24x128", 1, 4608, 4608, 24, 128},
      {"self S4608 24x64", 1, 4608, 4608, 24, 64},
      {"self S4608 24x72", 1, 4608, 4608, 24, 72},
      {"flux-cross Sq4096 Sk4608 24x128", 1, 4096, 4608, 24, 128},
      {"wan-cross Sq4680 Sk512 12x128", 1, 4680, 512, 12, 128},
  };
  std::map<std::string, double> f32_flash_s;  // per shape: flash-2t on f32 inputs
  for (const Shape4& s : shapes) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      if (dtype == DType::bf16 && s.d != 128) continue;  // bf16 only at the main shapes
      const Tensor q = random_bsnd(s.batch, s.sq, s.heads, s.d, dtype, 1);
      const Tensor k = random_bsnd(s.batch, s.sk, s.heads, s.d, dtype, 2);
      const Tensor v = random_bsnd(s.batch, s.sk, s.heads, s.d, dtype, 3);
      const double flops =
          4.0 * static_cast<double>(s.batch * s.heads) * static_cast<double>(s.sq) * static_cast<double>(s.sk) * static_cast<double>(s.d);
      const int runs = flops > 5e10 ? std::max(3, context.repeats / 2) : context.repeats;
      std::map<std::string, double> median;
      auto report = [&](const std::string& impl, const Timing& t, bool one_thread, const std::map<std::string, double>& extra = {}) {
        Result r{"attention", s.name, impl};
        r.extra = extra;
        r.dtype = std::string(dtype_name(dtype));
        r.timing = t;
        r.gflops = flops / t.median_s / 1e9;
        r.peak_fraction = r.gflops / context.machine.fma_peak_gflops;
        if (one_thread) r.extra["of_1t_peak"] = r.gflops / context.machine.fma_peak_1t_gflops;
        median[impl] = t.median_s;
        if (impl == "cv_pipelined" && median.count("flash-1t")) {
          r.extra["x_flash_1t"] = median["flash-1t"] / t.median_s;
          const auto st = ops::attn::last_cv_pipeline_stats();
          r.extra["vector_share"] = st.tiles ? static_cast<double>(st.vector_tiles) / static_cast<double>(st.tiles) : 0;
          r.extra["vector_packs"] = st.heads ? static_cast<double>(st.vector_packs) / static_cast<double>(st.heads) : 0;
        }
        context.add(r);
      };
      auto manual = [&](ops::AttentionImpl impl) {
        ops::AttentionOptions o;
        o.opt_mode = ops::AttentionOptMode::manual;
        o.op_type = impl;
        o.kernel_layout = ops::AttentionLayout::bsnd;
        return o;
      };
      report("flash-2t",
             time_runs([&] { ops::attention_forward(q, k, v, manual(ops::AttentionImpl::flash), stream_two).data_ptr(); }, runs), false);
      report("flash-1t",
             time_runs([&] { ops::attention_forward(q, k, v, manual(ops::AttentionImpl::flash), stream_split).data_ptr(); }, runs), true);
      report("cv_pipelined",
             time_runs([&] { ops::attention_forward(q, k, v, manual(ops::AttentionImpl::cv_pipelined), stream_split).data_ptr(); }, runs),
             false);
      if (dtype == DType::f32) f32_flash_s[s.name] = median["flash-2t"];
      if (dtype == DType::bf16 && ops::attention_impl_available(ops::AttentionImpl::flash_bf16)) {
        const Timing t =
            time_runs([&] { ops::attention_forward(q, k, v, manual(ops::AttentionImpl::flash_bf16), stream_two).data_ptr(); }, runs);
        std::map<std::string, double> extra;
        if (f32_flash_s.count(s.name)) extra["x_flash_f32"] = f32_flash_s[s.name] / t.median_s;
        if (context.machine.amx_peak_gflops > 0) extra["of_amx_peak"] = flops / t.median_s / 1e9 / context.machine.amx_peak_gflops;
        report("flash_bf16", t, false, extra);
        if (ops::attention_impl_available(ops::AttentionImpl::flash_int8)) {
          const Timing t8 =
              time_runs([&] { ops::attention_forward(q, k, v, manual(ops::AttentionImpl::flash_int8), stream_two).data_ptr(); }, runs);
          std::map<std::string, double> extra8{{"x_flash_bf16", t.median_s / t8.median_s}};
          if (f32_flash_s.count(s.name)) extra8["x_flash_f32"] = f32_flash_s[s.name] / t8.median_s;
          const Tensor exact = ops::attention_forward(q, k, v, manual(ops::AttentionImpl::flash), stream_two);
          const Tensor int8 = ops::attention_forward(q, k, v, manual(ops::AttentionImpl::flash_int8), stream_two);
          extra8["cosine"] = output_cosine(int8, exact, stream_two);
          extra8["one_minus_cosine"] = 1.0 - extra8["cosine"];  // the table prints 3 digits
          report("flash_int8", t8, false, extra8);
        }
      }
      if (s.sq <= 1280 && s.sk <= 1280)
        report("math", time_runs([&] { ops::attention_forward(q, k, v, manual(ops::AttentionImpl::math), stream_two).data_ptr(); }, runs),
               false);
      // The autotuner: the first call tunes (untimed warm-up), the timed calls reuse its pick.
      ops::AttentionOptions runtime;
      const Timing t = time_runs([&] { ops::attention_forward(q, k, v, runtime, stream_two).data_ptr(); }, runs);
      const ops::AttentionTuneKey key{s.batch, s.heads, s.d, s.sq, s.sk, dtype, ops::AttentionLayout::bsnd, ops::AttentionMaskKind::none};
      const auto pick = ops::AttentionTuner::global().find(key);
      report("runtime:" + (pick ? std::string(ops::attention_impl_name(pick->op_type)) + "/" +
                                      std::string(ops::attention_layout_name(pick->kernel_layout))
                                : std::string("?")),
             t, false);
    }
  }
}

}  // namespace cubevec::bench
