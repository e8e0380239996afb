// The GEMM calibration: which variants a family weighs on this CPU (kernel x L2 share), timing
// them on a class's problem, and choosing among the rates. The tuning file that keeps the choices
// is ops/gemm/tuner.cpp.
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>

#include "base/error.h"
#include "ops/gemm/tuner.h"
#include "tensor/half.h"

namespace cubevec::ops::gemm {

namespace {

constexpr int kShares[] = {2, 4, 8};

// Preference among kernels when their rates are close: the one with the most compute per instruction
// (0 first, below kRanks).
constexpr int kRanks = 5;
int preference_rank(const GemmVariant& v) {
  if (v.int8) return static_cast<int>(*v.int8);  // amx, avx512_vnni, avx_vnni, avx2, portable
  return v.bf16 == Bf16Path::amx ? 0 : v.bf16 == Bf16Path::dot ? 1 : 2;
}

}  // namespace

ClassProblem class_problem(ShapeClass shape) {
  // A DiT Linear's N (3072: FLUX.1's width): with a smaller N the packed B of a K block stays in L2
  // and the blockings rank differently than on real layers (measured: an AMX share that won by 5%
  // at N = 1536 lost by 20% at N = 3072). M is the class's middle. K is one AMX / f32 K block pair
  // for the smaller classes; the large class takes a DiT's K (3072) too: at K = 1024 a Zen 4's f32
  // variants measured 169-176 GFLOP/s where the real layers ran at 181-211; at K = 3072, 205-213.
  switch (shape) {
    case ShapeClass::skinny: return {64, 3072, 1024};
    case ShapeClass::small: return {512, 3072, 1024};
    case ShapeClass::large: return {2048, 3072, 3072};
  }
  return {2048, 3072, 3072};
}

std::vector<GemmVariant> candidate_variants(GemmFamily family, Isa isa) {
  if (family == GemmFamily::int8) {
    std::vector<Int8Isa> kernels;
    if (const auto forced = forced_int8_isa()) kernels = {*forced};
    else
      for (Int8Isa k : {Int8Isa::amx, Int8Isa::avx512_vnni, Int8Isa::avx_vnni, Int8Isa::avx2})
        if (int8_isa_supported(k) && !(k == Int8Isa::amx && amx_model_on())) kernels.push_back(k);  // never time the model
    if (kernels.empty()) kernels = {Int8Isa::portable};  // measured only where nothing faster exists
    std::vector<GemmVariant> out;
    for (Int8Isa k : kernels)
      for (int share : kShares) out.push_back({Bf16Path::f32, share, false, k});
    return out;
  }
  std::vector<Bf16Path> paths{Bf16Path::f32};
  if (family == GemmFamily::bf16 && isa == Isa::avx512) {
    if (const auto forced = forced_bf16_path()) paths = {*forced};
    else {
      paths.clear();
      for (Bf16Path p : {Bf16Path::amx, Bf16Path::dot, Bf16Path::f32})
        if (bf16_path_available(p) && !(p == Bf16Path::amx && amx_model_on())) paths.push_back(p);  // never time the model
    }
  }
  std::vector<GemmVariant> out;
  for (Bf16Path p : paths)
    for (int share : kShares) {
      out.push_back({p, share, false});
      if (p == Bf16Path::f32 && isa == Isa::avx512) out.push_back({p, share, true});
    }
  return out;
}

GemmVariant choose_variant(const std::vector<VariantRate>& rates) {
  if (rates.empty()) throw Error("gemm calibration: no variant was measured");
  // Each kernel's best share, then the preferred kernel unless another is clearly faster.
  std::optional<VariantRate> best_of[kRanks];
  for (const VariantRate& r : rates) {
    auto& slot = best_of[preference_rank(r.variant)];
    if (!slot || r.gflops > slot->gflops) slot = r;
  }
  std::optional<VariantRate> choice;
  for (const auto& candidate : best_of) {
    if (!candidate) continue;
    if (!choice || candidate->gflops > choice->gflops * kSwitchMargin) choice = candidate;
  }
  return choice->variant;
}

namespace {

// Each variant's best of two runs after a warm-up (which fills the caches and the workspace), the
// variants taking turns: round 0 warms every one up, rounds 1 and 2 time each once. On a shared
// machine the minimum is the steadier estimate of what a variant can do, and taking turns spreads a
// burst of someone else's work over all of them instead of sinking the one measured meanwhile (run
// back to back, the L2 shares of one kernel swapped places between calibrations on a noisy Zen 3).
// `progress` hears of each variant once, when its last run is timed.
void time_variants(const std::vector<GemmVariant>& variants, double flops, const std::function<void(std::size_t)>& run,
                   GemmTuneEntry& entry, const std::function<void(const VariantRate&)>& progress) {
  std::vector<double> best(variants.size(), 1e30);
  constexpr int kRounds = 3;
  for (int round = 0; round < kRounds; ++round)
    for (std::size_t i = 0; i < variants.size(); ++i) {
      const auto start = std::chrono::steady_clock::now();
      run(i);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (round > 0) best[i] = std::min(best[i], s);
      if (round == kRounds - 1) {
        const VariantRate rate{variants[i], flops / std::max(best[i], 1e-9) / 1e9};
        entry.considered.push_back(rate);
        if (progress) progress(rate);
      }
    }
}

// The float families (f32, bf16) on the class's problem: a Linear's weight packed once per kernel.
void measure_float(const GemmTuneKey& key, const ClassProblem& shape, const CpuCaches& caches, GemmTuneEntry& entry,
                   const std::function<void(const VariantRate&)>& progress) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> a(static_cast<std::size_t>(shape.m * shape.k)), w32(static_cast<std::size_t>(shape.n * shape.k)),
      c(static_cast<std::size_t>(shape.m * shape.n));
  for (float& v : a) v = dist(rng);
  for (float& v : w32) v = dist(rng);
  std::vector<uint16_t> w16(w32.size());
  convert_f32_to_bf16(w32.data(), w16.data(), w32.size());

  Problem p;
  p.m = shape.m, p.n = shape.n, p.k = shape.k;
  p.a = a.data(), p.lda = shape.k;
  p.trans_b = true, p.ldb = shape.k;
  p.c = c.data(), p.ldc = shape.n;
  // bf16: activations and weights both bf16, as a --dtype bf16 model runs.
  std::vector<uint16_t> a16(a.size());
  convert_f32_to_bf16(a.data(), a16.data(), a.size());
  if (key.family == GemmFamily::bf16) {
    p.a = a16.data(), p.a_type = Element::bf16;
    p.b = w16.data(), p.b_type = Element::bf16, p.compute = Element::bf16;
  } else {
    p.b = w32.data();
  }
  // Models pack their weights once; so does the measurement, once per bf16 kernel.
  const std::vector<GemmVariant> variants = candidate_variants(key.family, key.isa);
  std::vector<std::shared_ptr<const PackedB>> packed(variants.size());
  for (std::size_t i = 0; i < variants.size(); ++i) {
    for (std::size_t j = 0; j < i && !packed[i]; ++j)
      if (variants[j].bf16 == variants[i].bf16) packed[i] = packed[j];
    if (!packed[i]) packed[i] = pack_b_once_for(p, key.isa, key.family == GemmFamily::bf16 ? variants[i].bf16 : Bf16Path::f32);
  }
  const double flops = 2.0 * static_cast<double>(shape.m * shape.n * shape.k);
  time_variants(
      variants, flops,
      [&](std::size_t i) {
        Problem run = p;
        run.packed_b = packed[i].get();
        sgemm_variant(run, key.isa, key.threads, variants[i], caches);
      },
      entry, progress);
}

// The int8 family on the class's problem: quantized activations (u8, s8 + 128) times an s8 weight
// packed once per kernel, with W8A8's per-token and per-channel scales in the epilogue.
void measure_int8(const GemmTuneKey& key, const ClassProblem& shape, const CpuCaches& caches, GemmTuneEntry& entry,
                  const std::function<void(const VariantRate&)>& progress) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> dist(-127, 127);
  std::vector<uint8_t> a(static_cast<std::size_t>(shape.m * shape.k));
  std::vector<int8_t> w(static_cast<std::size_t>(shape.n * shape.k));
  for (uint8_t& v : a) v = static_cast<uint8_t>(dist(rng) + 128);
  for (int8_t& v : w) v = static_cast<int8_t>(dist(rng));
  std::vector<float> c(static_cast<std::size_t>(shape.m * shape.n)), row_scale(static_cast<std::size_t>(shape.m), 0.01f),
      col_scale(static_cast<std::size_t>(shape.n), 0.01f);
  const std::vector<GemmVariant> variants = candidate_variants(GemmFamily::int8, key.isa);
  std::vector<std::shared_ptr<const PackedInt8>> packed(variants.size());
  for (std::size_t i = 0; i < variants.size(); ++i) {
    for (std::size_t j = 0; j < i && !packed[i]; ++j)
      if (variants[j].int8 == variants[i].int8) packed[i] = packed[j];
    if (!packed[i]) packed[i] = pack_int8_weight(w.data(), shape.n, shape.k, shape.k, *variants[i].int8);
  }
  const double flops = 2.0 * static_cast<double>(shape.m * shape.n * shape.k);
  time_variants(
      variants, flops,
      [&](std::size_t i) {
        Int8Problem p;
        p.m = shape.m, p.n = shape.n;
        p.a = a.data(), p.lda = 4 * packed[i]->k_quads;  // K = 1024: no padding
        p.b = packed[i].get();
        p.c = c.data(), p.ldc = shape.n;
        p.epilogue.row_scale = row_scale.data(), p.epilogue.col_scale = col_scale.data();
        gemm_int8_variant(p, key.threads, variants[i].l2_share, caches);
      },
      entry, progress);
}

// The variant of `entry` (if any) for a kernel fixed by a packed weight: its best measured share.
GemmVariant best_for_int8_kernel(const GemmTuneEntry& entry, Int8Isa kernel) {
  GemmVariant best{Bf16Path::f32, 2, false, kernel};
  double rate = -1;
  for (const VariantRate& r : entry.considered)
    if (r.variant.int8 == kernel && r.gflops > rate) best = r.variant, rate = r.gflops;
  return best;
}

}  // namespace

std::optional<GemmTuneEntry> amx_model_choice(const GemmTuneKey& key) {
  if (!amx_model_on() || (key.family == GemmFamily::f32)) return std::nullopt;
  for (const GemmVariant& v : candidate_variants(key.family, key.isa))
    if (v.int8 == Int8Isa::amx || (!v.int8 && v.bf16 == Bf16Path::amx)) return GemmTuneEntry{key, v, {}};
  return std::nullopt;
}

GemmTuneEntry calibrate(const GemmTuneKey& key, const CpuCaches& caches, const std::function<void(const VariantRate&)>& progress) {
  if (key.threads < 1) throw Error("gemm calibration: threads must be at least 1, got " + std::to_string(key.threads));
  if (amx_model_choice(key))
    throw Error("gemm calibration: the " + std::string(gemm_family_name(key.family)) +
                " kernel is forced onto the AMX tile model (CUBEVEC_AMX_MODEL=1), whose speed says nothing about AMX's: it is not timed");
  if (!isa_supported(key.isa)) throw Error("gemm calibration: ISA " + std::string(isa_name(key.isa)) + " is not supported by this CPU");
  GemmTuneEntry entry;
  entry.key = key;
  tbb::task_arena arena(key.threads);
  arena.execute([&] {
    if (key.family == GemmFamily::int8) measure_int8(key, class_problem(key.shape), caches, entry, progress);
    else measure_float(key, class_problem(key.shape), caches, entry, progress);
  });
  entry.choice = choose_variant(entry.considered);
  return entry;
}

Int8Isa chosen_int8_isa(int threads) {
  if (const auto forced = forced_int8_isa()) return *forced;
  const GemmTuneEntry entry = GemmTuner::global().choose({GemmFamily::int8, best_isa(), ShapeClass::large, std::max(threads, 1)});
  return entry.choice.int8.value_or(best_int8_isa());
}

int int8_l2_share(Int8Isa kernel, int64_t m, int threads) {
  const GemmTuneEntry entry = GemmTuner::global().choose({GemmFamily::int8, best_isa(), shape_class_of(m), std::max(threads, 1)});
  return best_for_int8_kernel(entry, kernel).l2_share;
}

}  // namespace cubevec::ops::gemm
