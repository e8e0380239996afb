// Suite `gemm`: GEMM at DiT sizes, y = x W^T as a Linear runs it. In the same run: OpenBLAS as the
// environment configures it (its own threads, OPENBLAS_CORETYPE as set) and Eigen (split over the
// same threads) on f32; cubevec with every variant its calibration weighs (each bf16 kernel the CPU
// has, at each L2 share), the one it chose marked; PyTorch 1.13's F.linear in f32 and bf16. Each
// cubevec row states the fraction of the measured peak of the instructions it uses (FMA, AVX512-BF16
// dot product or AMX-BF16; extra "peak_gflops"), the chosen variant's impl name ends in " *".
#include <cblas.h>
#include <tbb/task_arena.h>

#include <random>

#include "bench/harness.h"
#include "bench/torch_baseline.h"
#include "ops/gemm.h"
#include "ops/gemm/tuner.h"
#include "tensor/half.h"

namespace cubevec::bench {

namespace {

std::vector<float> random_values(int64_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(count));
  for (float& x : v) x = dist(rng);
  return v;
}

double peak_of(const Machine& machine, ops::gemm::Bf16Path kernel, bool bf16) {
  if (!bf16 || kernel == ops::gemm::Bf16Path::f32) return machine.fma_peak_gflops;
  return kernel == ops::gemm::Bf16Path::amx ? machine.amx_peak_gflops : machine.bf16_dot_peak_gflops;
}

}  // namespace

void gemm_suite(Context& context) {
  namespace g = ops::gemm;
  const int threads = context.machine.threads;
  const g::Isa isa = g::best_isa();
  const nlohmann::json torch = run_torch("torch_gemm.py", threads, context.repeats);
  if (torch.is_null()) std::fprintf(stderr, "note: the PyTorch baseline did not run (needs Debian's python3-torch)\n");
  const int64_t shapes[][3] = {{4096, 3072, 3072}, {4096, 12288, 3072}, {4608, 9216, 3072}, {1024, 1024, 1024}, {256, 3072, 3072}};
  tbb::task_arena arena(threads);
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    const std::string case_name = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    const auto x = random_values(m * k, 1), w = random_values(n * k, 2);
    std::vector<uint16_t> x16(x.size()), w16(w.size());
    convert_f32_to_bf16(x.data(), x16.data(), x.size());
    convert_f32_to_bf16(w.data(), w16.data(), w.size());
    std::vector<float> c(static_cast<std::size_t>(m * n));
    const int runs = flops > 1e11 ? std::max(2, context.repeats / 2) : context.repeats;
    std::map<std::string, double> best_s;  // "f32" / "bf16": cubevec's chosen variant; "openblas"
    const auto add = [&](Result r, const Timing& t, double peak) {
      r.timing = t;
      r.gflops = flops / t.median_s / 1e9;
      if (peak > 0) r.peak_fraction = r.gflops / peak, r.extra["peak_gflops"] = peak;
      if (best_s.count("openblas")) r.extra["x_openblas"] = best_s["openblas"] / t.median_s;
      context.add(r);
    };
    openblas_set_num_threads(threads);
    add({"gemm", case_name, "openblas"},
        time_runs(
            [&] {
              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f,
                          x.data(), static_cast<int>(k), w.data(), static_cast<int>(k), 0.0f, c.data(), static_cast<int>(n));
            },
            runs),
        context.machine.fma_peak_gflops);
    best_s["openblas"] = context.results.back().timing.median_s;
    openblas_set_num_threads(1);  // back to what cubevec's own OpenBLAS backend expects
    {
      DeviceProfile profile = builtin_cpu_profile();
      profile.cube_threads = threads;
      Device device(profile);
      const Stream stream = device.new_stream("gemm");
      const Tensor xt = Tensor::from_vector(x, {m, k}), wt = Tensor::from_vector(w, {n, k});
      add({"gemm", case_name, "eigen"},
          time_runs([&] { ops::matmul(xt, wt, {.b_is_weight = true, .backend = ops::GemmBackend::eigen}, stream).data_ptr(); }, runs),
          context.machine.fma_peak_gflops);
    }
    // cubevec: the weight packed once, as a model's Linear does; every variant, the chosen one marked.
    for (const bool bf16 : {false, true}) {
      g::Problem p;
      p.m = m, p.n = n, p.k = k, p.lda = k, p.ldb = k, p.trans_b = true, p.c = c.data(), p.ldc = n;
      p.a = bf16 ? static_cast<const void*>(x16.data()) : x.data();
      p.a_type = bf16 ? g::Element::bf16 : g::Element::f32;
      p.b = bf16 ? static_cast<const void*>(w16.data()) : w.data();
      p.b_type = p.a_type;
      p.compute = p.a_type;
      const g::GemmTuneKey key{bf16 ? g::GemmFamily::bf16 : g::GemmFamily::f32, isa, g::shape_class_of(m), threads};
      const g::GemmTuneEntry entry = arena.execute([&] { return g::GemmTuner::global().choose(key); });
      std::shared_ptr<const g::PackedB> packed;
      for (const g::GemmVariant& variant : g::candidate_variants(key.family, isa)) {
        if (!packed || packed->bf16 != (bf16 ? variant.bf16 : g::Bf16Path::f32)) packed = g::pack_b_once_for(p, isa, variant.bf16);
        g::Problem run = p;
        run.packed_b = packed.get();
        const bool chosen = variant == entry.choice;
        Result r{"gemm", case_name, "cubevec-" + std::string(bf16 ? "bf16-" : "f32-") + variant.name() + (chosen ? " *" : "")};
        r.dtype = bf16 ? "bf16" : "f32";
        const Timing t = arena.execute([&] { return time_runs([&] { g::sgemm_variant(run, isa, threads, variant); }, runs); });
        r.extra["chosen"] = chosen ? 1 : 0;
        for (const auto& rate : entry.considered)
          if (rate.variant == variant) r.extra["calibration_gflops"] = rate.gflops;
        if (chosen) best_s[r.dtype] = t.median_s;
        if (bf16 && best_s.count("f32")) r.extra["x_cubevec_f32"] = best_s["f32"] / t.median_s;
        add(r, t, peak_of(context.machine, variant.bf16, bf16));
      }
    }
    if (!torch.is_null())
      for (const auto& row : torch["results"])
        if (row["block"] == case_name) {
          const std::string dtype = row["dtype"];
          Result r{"gemm", case_name, "torch-" + dtype};
          r.dtype = dtype;
          r.timing = summarize(row["runs_s"].get<std::vector<double>>());
          r.gflops = flops / r.timing.median_s / 1e9;
          if (best_s.count(dtype)) r.extra["x_cubevec_chosen"] = r.timing.median_s / best_s[dtype];
          context.add(r);
        }
  }
}

}  // namespace cubevec::bench
