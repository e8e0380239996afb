#include "ops/gemm/driver.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "ops/gemm/microkernel.h"
#include "ops/gemm/microkernel_bf16.h"
#include "ops/gemm/panel_prefetch.h"
#include "ops/gemm/tuner.h"
#include "tensor/caching_allocator.h"
#include "base/error.h"
#include "tensor/half.h"

namespace cubevec::ops::gemm {

namespace {

// A micro-kernel on packed elements of type P, and the blocking around it. Packed B panels hold
// `kgroup` consecutive k values per column (1 for f32, 2 for the bf16 pairs of vdpbf16ps and AMX),
// packed A panels `a_kgroup` per row (AMX: 32, a tile row); each K block is zero-padded to a
// multiple of `kpad`. The micro-kernel gets the padded depth in kgroup steps.
template <class P>
struct Plan {
  void (*micro)(int64_t k_steps, const P* a, const P* b, float* c, int64_t ldc, bool accumulate);
  EpilogueFn epilogue;
  int64_t mr, nr, kc, mc, nc;
  int64_t kgroup;
  int64_t a_kgroup = 0, kpad = 0;  // 0: kgroup
  // Optional: a tile of fewer than MR rows (and all NR columns), written straight to C.
  void (*micro_rows)(int rows, int64_t k_steps, const P* a, const P* b, float* c, int64_t ldc, bool accumulate) = nullptr;
  int64_t a_group() const { return a_kgroup ? a_kgroup : kgroup; }
  int64_t padded(int64_t k) const {
    const int64_t to = kpad ? kpad : kgroup;
    return (k + to - 1) / to * to;
  }
};

// The kernels and their K blocking; MC and NC come from blocking_of. KC is fixed per kernel: the
// panels of a packed B and the order of the sums depend on it.
Plan<float> f32_kernel(Isa isa, bool prefetch = false) {
  // For AVX-512 a long KC measured best (4096x3072x3072 on 2 Zen 5 threads: KC 256 -> 312 GFLOP/s,
  // 512 -> 377, 768 -> 351-383, 1024 -> 384-389): fewer passes over C outweigh a B micro-panel
  // that no longer fits L1 (it streams from L2 well).
  switch (isa) {
    case Isa::avx512: {
      Plan<float> plan{prefetch ? microkernel_avx512_prefetch : microkernel_avx512, epilogue_avx512, kMrAvx512, kNrAvx512, 768, 0, 0, 1};
      plan.micro_rows = prefetch ? microkernel_avx512_prefetch_rows : microkernel_avx512_rows;
      return plan;
    }
    case Isa::avx2: return {microkernel_avx2, epilogue_avx2, kMrAvx2, kNrAvx2, 256, 0, 0, 1};
    case Isa::portable: return {microkernel_portable, epilogue_portable, kMrPortable, kNrPortable, 256, 0, 0, 1};
  }
  throw Error("gemm: invalid ISA");
}

Plan<uint16_t> bf16_kernel(Bf16Path path) {
  // AVX512-BF16: the f32 plan's bytes per panel at twice the k depth. AMX: B's 32-column
  // micro-panel (KC x 32 bf16 = 32 KiB) stays in L1 while the A panels stream past it (measured on
  // a 2-core Xeon, 4096x3072x3072: KC 1536 -> 1141 GFLOP/s, 512 -> 1389, 256 -> 1315).
  if (path == Bf16Path::amx) {
    if (!amx_ready()) throw Error("gemm: the AMX-BF16 kernel is not available on this CPU");
    return {amx_model_on() ? amx_model::microkernel_bf16_amx : microkernel_bf16_amx, epilogue_avx512, kMrAmx, kNrAmx, 512, 0, 0, 2, 32, 32};
  }
  Plan<uint16_t> plan{microkernel_bf16_avx512, epilogue_avx512, kMrBf16, kNrBf16, 1536, 0, 0, 2};
  plan.micro_rows = microkernel_bf16_avx512_rows;
  return plan;
}

template <class P>
Plan<P> with_blocking(Plan<P> plan, const Blocking& blocking) {
  plan.mc = blocking.mc;
  plan.nc = blocking.nc;
  return plan;
}

// Workspace from the caching allocator: the same blocks come back call after call, already mapped.
template <class P>
struct Workspace {
  explicit Workspace(std::size_t count) : ptr(static_cast<P*>(default_allocator().allocate(count * sizeof(P)))) {}
  ~Workspace() { default_allocator().deallocate(ptr); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  P* ptr;
};

// Reads element (row, col) of an operand stored as S, converted to the packed type P; with
// `round_bf16`, f32 values packed as f32 are first rounded to bf16 (bf16 compute without the dot).
template <class P, class S>
inline P load_as(const S* base, int64_t index, bool round_bf16) {
  if constexpr (std::is_same_v<P, float>) {
    if constexpr (std::is_same_v<S, float>) return round_bf16 ? bf16_to_f32(f32_to_bf16(base[index])) : base[index];
    else return bf16_to_f32(base[index]);
  } else {
    if constexpr (std::is_same_v<S, float>) return f32_to_bf16(base[index]);
    else return base[index];
  }
}

// An int8 weight element times its column's scale, as the packed type P (rounded to bf16 when
// computing in bf16).
template <class P>
inline P load_scaled(const int8_t* base, int64_t index, float scale, bool round_bf16) {
  const float v = static_cast<float>(base[index]) * scale;
  if constexpr (std::is_same_v<P, float>) return round_bf16 ? bf16_to_f32(f32_to_bf16(v)) : v;
  else return f32_to_bf16(v);
}

// A[i0 .. i0+mc, p0 .. p0+kc] into MR-row panels of kgroup-wide k steps, zero-padded. Each row of
// A is read sequentially (the panel being written is small enough to stay in L1).
template <class P, class S>
void pack_a(const Problem& p, const Plan<P>& plan, int64_t i0, int64_t mc, int64_t p0, int64_t kc, P* out) {
  const auto* a = static_cast<const S*>(p.a);
  const bool round = p.compute == Element::bf16;
  const int64_t g = plan.a_group(), panel = plan.padded(kc) * plan.mr;
  for (int64_t ir = 0; ir < mc; ir += plan.mr, out += panel) {
    const int64_t rows = std::min(plan.mr, mc - ir);
    if (rows < plan.mr || plan.padded(kc) != kc) std::fill(out, out + panel, P{});
    if (g == 1) {  // one k step per panel column: written in order, the rows read side by side
      // Element by element through k / g and k % g it was 4.2% of a 1024^3 f32 GEMM's profile on a
      // Zen 3 (3.5% this way); A is read once per call, so memory sets the floor.
      const auto copy_panel = [&](auto round_bf16) {
        const S* rows_src[32];  // MR <= 32
        for (int64_t r = 0; r < rows; ++r) rows_src[r] = a + (i0 + ir + r) * p.lda + p0;
        for (int64_t k = 0; k < kc; ++k)
          for (int64_t r = 0; r < rows; ++r) out[k * plan.mr + r] = load_as<P, S>(rows_src[r], k, round_bf16);
      };
      if (round) copy_panel(std::true_type{});
      else copy_panel(std::false_type{});
      continue;
    }
    for (int64_t r = 0; r < rows; ++r) {
      const S* src = a + (i0 + ir + r) * p.lda + p0;
      if constexpr (std::is_same_v<P, uint16_t>) {
        if (g == 2) {  // vdpbf16ps pairs: pair q of the row is one 32-bit word, word q * MR + r of the panel
          // Element by element through k / g and k % g this was 12% of a 256x3072x3072 bf16 GEMM
          // on a 2-core Zen 4 (its A is packed once per call, by each thread that needs it).
          uint16_t* dst = out + 2 * r;
          const int64_t pairs = kc / 2, stride = 2 * plan.mr;
          for (int64_t q = 0; q < pairs; ++q) {
            if constexpr (std::is_same_v<S, float>) {
              dst[q * stride] = f32_to_bf16(src[2 * q]), dst[q * stride + 1] = f32_to_bf16(src[2 * q + 1]);
            } else {
              uint32_t word;
              std::memcpy(&word, src + 2 * q, sizeof word);
              std::memcpy(dst + q * stride, &word, sizeof word);
            }
          }
          if (kc % 2) dst[pairs * stride] = load_as<P, S>(src, kc - 1, round);  // its partner is the fill's zero
          continue;
        }
        if (g == 32) {  // AMX: each 32-deep row segment is one contiguous run of the panel
          for (int64_t k0 = 0; k0 < kc; k0 += 32) {
            uint16_t* dst = out + (k0 / 32 * plan.mr + r) * 32;
            const int n = static_cast<int>(std::min<int64_t>(32, kc - k0));
            if constexpr (std::is_same_v<S, float>) f32_to_bf16_block_amx(src + k0, dst, n);
            else std::copy_n(src + k0, n, dst);
          }
          continue;
        }
      }
      for (int64_t k = 0; k < kc; ++k) out[(k / g * plan.mr + r) * g + k % g] = load_as<P, S>(src, k, round);
    }
  }
}

// B[p0 .. p0+kc, j0 .. j0+nc] into NR-column panels of kgroup-wide k steps, zero-padded.
template <class P, class S>
void pack_b(const Problem& p, const Plan<P>& plan, int64_t p0, int64_t kc, int64_t j0, int64_t nc, P* out) {
  const auto* b = static_cast<const S*>(p.b);
  const bool round = p.compute == Element::bf16;
  const int64_t g = plan.kgroup, k_steps = plan.padded(kc) / g, panel = k_steps * g * plan.nr;
  for (int64_t jr = 0; jr < nc; jr += plan.nr, out += panel) {
    const int64_t cols = std::min(plan.nr, nc - jr);
    if (cols < plan.nr || k_steps * g != kc) std::fill(out, out + panel, P{});
    if (!p.trans_b) {  // row k of the block is contiguous in B
      for (int64_t k = 0; k < kc; ++k) {
        const S* src = b + (p0 + k) * p.ldb + j0 + jr;
        P* dst = out + (k / g) * g * plan.nr + k % g;
        for (int64_t j = 0; j < cols; ++j) dst[j * g] = load_as<P, S>(src, j, round);
      }
    } else if constexpr (std::is_same_v<P, uint16_t> && std::is_same_v<S, uint16_t>) {
      // bf16 W^T into bf16 pairs: each pair (k, k+1) of row j of W is one 32-bit word, which goes to
      // word (k / 2) * NR + j of the panel (a weight of FLUX.1's size packs at memory speed, not
      // element by element).
      static_assert(sizeof(uint32_t) == 2 * sizeof(uint16_t));
      const int64_t pairs = kc / 2;
      for (int64_t j = 0; j < cols; ++j) {
        const S* src = b + (j0 + jr + j) * p.ldb + p0;
        for (int64_t q = 0; q < pairs; ++q) {
          uint32_t word;
          std::memcpy(&word, src + 2 * q, sizeof word);
          std::memcpy(out + (q * plan.nr + j) * 2, &word, sizeof word);
        }
        if (kc % 2) out[(pairs * plan.nr + j) * 2] = src[kc - 1];
      }
    } else {  // B = W^T with W [N, K]: column j of B is row j of W, contiguous in k
      for (int64_t j = 0; j < cols; ++j) {
        const S* src = b + (j0 + jr + j) * p.ldb + p0;
        for (int64_t k = 0; k < kc; ++k) out[(k / g * plan.nr + j) * g + k % g] = load_as<P, S>(src, k, round);
      }
    }
  }
}

// B = (W_int8 x scale)^T with W [N, K] (trans_b): column j of B is row j of W times scale[j].
template <class P>
void pack_b_int8(const Problem& p, const Plan<P>& plan, int64_t p0, int64_t kc, int64_t j0, int64_t nc, P* out) {
  const auto* b = static_cast<const int8_t*>(p.b);
  const bool round = p.compute == Element::bf16;
  const int64_t g = plan.kgroup, k_steps = plan.padded(kc) / g, panel = k_steps * g * plan.nr;
  for (int64_t jr = 0; jr < nc; jr += plan.nr, out += panel) {
    const int64_t cols = std::min(plan.nr, nc - jr);
    if (cols < plan.nr || k_steps * g != kc) std::fill(out, out + panel, P{});
    for (int64_t j = 0; j < cols; ++j) {
      const int8_t* src = b + (j0 + jr + j) * p.ldb + p0;
      const float scale = p.b_scale[j0 + jr + j];
      for (int64_t k = 0; k < kc; ++k) out[(k / g * plan.nr + j) * g + k % g] = load_scaled<P>(src, k, scale, round);
    }
  }
}

template <class P>
using PackA = void (*)(const Problem&, const Plan<P>&, int64_t, int64_t, int64_t, int64_t, P*);
template <class P>
using PackB = void (*)(const Problem&, const Plan<P>&, int64_t, int64_t, int64_t, int64_t, P*);

// The serial blocked algorithm on rows [row0, row1) and columns [col0, col1) of C.
template <class P>
void gemm_block(const Problem& p, const Plan<P>& plan, int64_t row0, int64_t row1, int64_t col0, int64_t col1) {
  const int64_t m = row1 - row0, n = col1 - col0;
  if (m <= 0 || n <= 0) return;
  const PackA<P> pack_a_fn = p.a_type == Element::f32 ? pack_a<P, float> : pack_a<P, uint16_t>;
  const PackB<P> pack_b_fn = p.b_type == Element::f32 ? pack_b<P, float> : p.b_type == Element::i8 ? pack_b_int8<P> : pack_b<P, uint16_t>;
  const auto round_up = [](int64_t v, int64_t to) { return (v + to - 1) / to * to; };
  // NC bounds the B block packed per call; a B packed once needs no such block, and one pass over all
  // of N packs each A block once instead of once per NC columns (the f32 -> bf16 conversion of A
  // was a sixth of a T5-XXL layer's GEMM time at M = 512).
  const int64_t nc_step = p.packed_b ? n : plan.nc;
  const int64_t nc_max = std::min(nc_step, round_up(n, plan.nr));
  // The rows in A blocks of at most MC, evened out: 256 rows at MC 252 as 252 + 4 would run the last
  // block's 4 rows over every B panel for one call each.
  const int64_t blocks_m = (m + plan.mc - 1) / plan.mc;
  const int64_t mc_step = std::min(plan.mc, round_up((m + blocks_m - 1) / blocks_m, plan.mr));  // <= m rounded up
  const int64_t kc_max = plan.padded(std::min(plan.kc, std::max<int64_t>(p.k, 1)));
  Workspace<P> packed_a(static_cast<std::size_t>(mc_step * kc_max)),
      packed_b(p.packed_b ? std::size_t{1} : static_cast<std::size_t>(nc_max * kc_max));
  alignas(64) float edge[32 * 32];  // full tile for partial edges (MR, NR <= 32)

  if (p.k == 0) {  // C = 0, then the epilogue
    for (int64_t i = row0; i < row1; ++i) std::fill(p.c + i * p.ldc + col0, p.c + i * p.ldc + col1, 0.0f);
    if (!p.epilogue.empty()) plan.epilogue(p.epilogue, p.c + row0 * p.ldc + col0, p.ldc, row0, col0, m, n);
    return;
  }
  for (int64_t jc = col0; jc < col1; jc += nc_step) {
    const int64_t nc = std::min(nc_step, col1 - jc);
    for (int64_t pc = 0; pc < p.k; pc += plan.kc) {
      const int64_t kc = std::min(plan.kc, p.k - pc);
      const int64_t k_steps = plan.padded(kc) / plan.kgroup;
      const bool first = pc == 0, last = pc + kc == p.k;
      const P* b_block = nullptr;
      if (p.packed_b) {
        const auto& pre = p.packed_b;
        const P* base;
        if constexpr (std::is_same_v<P, float>) base = pre->f32_data();
        else base = pre->bf16_data();
        // Panels of the whole N for this K block, NR columns each: jc is a multiple of NR.
        b_block = base + (pc / plan.kc) * pre->panel_stride + (jc / plan.nr) * k_steps * plan.kgroup * plan.nr;
      } else {
        pack_b_fn(p, plan, pc, kc, jc, nc, packed_b.ptr);
        b_block = packed_b.ptr;
      }
      for (int64_t ic = row0; ic < row1; ic += mc_step) {
        const int64_t mc = std::min(mc_step, row1 - ic);
        pack_a_fn(p, plan, ic, mc, pc, kc, packed_a.ptr);
        for (int64_t jr = 0; jr < nc; jr += plan.nr) {
          const int64_t cols = std::min(plan.nr, nc - jr);
          const int64_t panel_elements = k_steps * plan.kgroup * plan.nr;
          const P* b_panel = b_block + jr * k_steps * plan.kgroup;
          NextPanelPrefetch next_panel(jr + plan.nr < nc ? b_panel + panel_elements : nullptr,
                                       panel_elements * static_cast<int64_t>(sizeof(P)), (mc + plan.mr - 1) / plan.mr);
          for (int64_t ir = 0; ir < mc; ir += plan.mr) {
            const int64_t rows = std::min(plan.mr, mc - ir);
            next_panel.step();
            const P* a_panel = packed_a.ptr + ir * k_steps * plan.kgroup;
            float* c_tile = p.c + (ic + ir) * p.ldc + jc + jr;
            if (rows == plan.mr && cols == plan.nr) {
              plan.micro(k_steps, a_panel, b_panel, c_tile, p.ldc, !first);
            } else if (cols == plan.nr && plan.micro_rows) {
              plan.micro_rows(static_cast<int>(rows), k_steps, a_panel, b_panel, c_tile, p.ldc, !first);
            } else {  // edge tile: compute in full, copy the valid part
              for (int64_t r = 0; r < rows && !first; ++r) std::copy(c_tile + r * p.ldc, c_tile + r * p.ldc + cols, edge + r * plan.nr);
              plan.micro(k_steps, a_panel, b_panel, edge, plan.nr, !first);
              for (int64_t r = 0; r < rows; ++r) std::copy(edge + r * plan.nr, edge + r * plan.nr + cols, c_tile + r * p.ldc);
            }
            if (last && !p.epilogue.empty()) plan.epilogue(p.epilogue, c_tile, p.ldc, ic + ir, jc + jr, rows, cols);
          }
        }
      }
    }
  }
}

// Splits the larger side of C into one contiguous part per thread, in whole register tiles.
template <class P>
void run_split(const Problem& p, const Plan<P>& plan, int threads) {
  const bool by_rows = p.m >= p.n;
  const int64_t extent = by_rows ? p.m : p.n, tile = by_rows ? plan.mr : plan.nr;
  const int64_t parts = std::clamp<int64_t>((extent + tile - 1) / tile, 1, std::max(threads, 1));
  const int64_t per_part = ((extent + parts - 1) / parts + tile - 1) / tile * tile;
  tbb::parallel_for(int64_t{0}, parts, [&](int64_t part) {
    const int64_t lo = part * per_part, hi = std::min(extent, lo + per_part);
    if (by_rows) gemm_block(p, plan, lo, hi, 0, p.n);
    else gemm_block(p, plan, 0, p.m, lo, hi);
  });
}

}  // namespace

bool has_bf16_dot() {
  static const bool has = isa_supported(Isa::avx512) && __builtin_cpu_supports("avx512bf16");
  return has;
}

std::string_view bf16_path_name(Bf16Path path) {
  switch (path) {
    case Bf16Path::amx: return "amx";
    case Bf16Path::dot: return "avx512bf16";
    case Bf16Path::f32: return "f32";
  }
  return "?";
}

bool bf16_path_available(Bf16Path path) {
  switch (path) {
    case Bf16Path::amx: return amx_ready();
    case Bf16Path::dot: return has_bf16_dot();
    case Bf16Path::f32: return true;
  }
  return false;
}

std::optional<Bf16Path> parse_bf16_path(std::string_view name) {
  for (Bf16Path p : {Bf16Path::amx, Bf16Path::dot, Bf16Path::f32})
    if (bf16_path_name(p) == name) return p;
  return std::nullopt;
}

std::optional<Bf16Path> forced_bf16_path() {
  static const std::optional<Bf16Path> path = []() -> std::optional<Bf16Path> {
    const char* forced = std::getenv("CUBEVEC_GEMM_BF16");
    if (!forced || !*forced) return std::nullopt;
    const auto p = parse_bf16_path(forced);
    if (!p) throw Error("CUBEVEC_GEMM_BF16=" + text_for_message(forced) + ": expected amx, avx512bf16 or f32");
    if (!bf16_path_available(*p)) throw Error("CUBEVEC_GEMM_BF16=" + text_for_message(forced) + ": this CPU (or kernel) does not offer it");
    return p;
  }();
  return path;
}

Isa best_isa() {
  static const Isa best = select_isa("CUBEVEC_GEMM_ISA");
  return best;
}

Blocking blocking_of(const GemmVariant& variant, Isa isa, const CpuCaches& caches) {
  const bool bf16 = variant.bf16 != Bf16Path::f32;
  int64_t kc, mr, nr, bytes;
  if (bf16) {
    const Plan<uint16_t> kernel = bf16_kernel(variant.bf16);
    kc = kernel.kc, mr = kernel.mr, nr = kernel.nr, bytes = 2;
  } else {
    const Plan<float> kernel = f32_kernel(isa);
    kc = kernel.kc, mr = kernel.mr, nr = kernel.nr, bytes = 4;
  }
  const int64_t share = std::max(variant.l2_share, 1);
  // MC: the packed A block (MC x KC) fills the L2 share, in whole MR panels; NC: the B block packed
  // per call (KC x NC) within a quarter of the L3, at most 4096 columns.
  const int64_t mc = std::clamp<int64_t>(caches.l2 / share / (kc * bytes) / mr * mr, mr, 64 * mr);
  const int64_t nc = std::clamp<int64_t>(caches.l3 / 4 / (kc * bytes) / nr * nr, 4 * nr, 4096 / nr * nr);
  return {kc, mc, nc};
}

namespace {

template <class P>
void pack_all(const Problem& p, const Plan<P>& plan, PackedB& out, AllocatedArray<P>& data) {
  const int64_t n_panels = (p.n + plan.nr - 1) / plan.nr;
  out.kc = plan.kc;
  const int64_t kc_full = plan.padded(plan.kc);
  out.panel_stride = n_panels * plan.nr * kc_full;
  const int64_t blocks = (p.k + plan.kc - 1) / plan.kc;
  data.assign(static_cast<std::size_t>(std::max<int64_t>(blocks, 1) * out.panel_stride), P{});
  const auto pack = p.b_type == Element::f32 ? pack_b<P, float> : pack_b<P, uint16_t>;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t pc = b * plan.kc, kc = std::min(plan.kc, p.k - pc);
    pack(p, plan, pc, kc, 0, p.n, data.data() + b * out.panel_stride);
  }
}

}  // namespace

namespace {

bool uses_bf16_kernels(const Problem& p, Isa isa) { return p.compute == Element::bf16 && isa == Isa::avx512; }

// The best measured share for a kernel, or its default when it was not measured.
GemmVariant variant_for_path(const GemmTuneEntry* entry, Bf16Path path) {
  GemmVariant best{path, path == Bf16Path::amx ? 8 : 2};
  double rate = -1;
  if (entry)
    for (const VariantRate& r : entry->considered)
      if (r.variant.bf16 == path && r.gflops > rate) best = r.variant, rate = r.gflops;
  return best;
}

// The calibrated variant for p, honouring a forced bf16 path and the path p's packed B was made for.
GemmVariant chosen_variant(const Problem& p, Isa isa, int threads) {
  const bool bf16 = uses_bf16_kernels(p, isa);
  const GemmTuneKey key{bf16 ? GemmFamily::bf16 : GemmFamily::f32, isa, shape_class_of(p.m), std::max(threads, 1)};
  // A per-thread copy of the tuner's entries keeps the lock off the hot path (attention's math
  // path runs thousands of small GEMMs).
  thread_local std::vector<GemmTuneEntry> seen;
  thread_local uint64_t seen_generation = ~uint64_t{0};
  GemmTuner& tuner = GemmTuner::global();
  if (seen_generation != tuner.generation()) seen.clear(), seen_generation = tuner.generation();
  const GemmTuneEntry* entry = nullptr;
  for (const auto& e : seen)
    if (e.key == key) entry = &e;
  const std::optional<Bf16Path> forced = bf16 ? forced_bf16_path() : std::nullopt;
  if (!entry && !forced) {
    seen.push_back(tuner.choose(key));
    seen_generation = tuner.generation();
    entry = &seen.back();
  }
  if (p.packed_b) return variant_for_path(entry, p.packed_b->bf16);
  if (forced) return variant_for_path(entry, *forced);
  return entry->choice;
}

}  // namespace

namespace {

std::atomic<uint64_t> packed_b_calls{0};

// The bf16 kernel pack_b_once packs for: forced, or the calibration's choice for large shapes.
Bf16Path pack_path(Element compute, Isa isa, int threads) {
  if (compute != Element::bf16 || isa != Isa::avx512) return Bf16Path::f32;
  if (const auto forced = forced_bf16_path()) return *forced;
  const int t = threads > 0 ? threads : tbb::this_task_arena::max_concurrency();
  return GemmTuner::global().choose({GemmFamily::bf16, isa, ShapeClass::large, t}).choice.bf16;
}

// KC and the panel stride of `plan` for an [N, K] B, and the bytes of all its K blocks.
template <class P>
PackedLayout layout_of(const Plan<P>& plan, int64_t n, int64_t k, Bf16Path path) {
  PackedLayout layout;
  layout.bf16 = path;
  layout.kc = plan.kc;
  layout.panel_stride = (n + plan.nr - 1) / plan.nr * plan.nr * plan.padded(plan.kc);
  const int64_t blocks = std::max<int64_t>((k + plan.kc - 1) / plan.kc, 1);
  layout.bytes = static_cast<std::size_t>(blocks * layout.panel_stride) * sizeof(P);
  return layout;
}

PackedLayout layout_for_path(int64_t n, int64_t k, Element compute, Isa isa, Bf16Path path) {
  if (compute == Element::bf16 && isa == Isa::avx512 && path != Bf16Path::f32) return layout_of(bf16_kernel(path), n, k, path);
  return layout_of(f32_kernel(isa), n, k, Bf16Path::f32);
}

}  // namespace

std::size_t PackedB::bytes() const { return layout_for_path(n, k, compute, isa, bf16).bytes; }

PackedLayout packed_layout(int64_t n, int64_t k, Element compute, Isa isa, int threads) {
  return layout_for_path(n, k, compute, isa, pack_path(compute, isa, threads));
}

std::shared_ptr<const PackedB> adopt_packed_b(int64_t n, int64_t k, Element compute, Isa isa, const PackedLayout& layout, const void* data,
                                              std::shared_ptr<const void> owner) {
  if (!isa_supported(isa)) throw Error("gemm: ISA " + std::string(isa_name(isa)) + " is not supported by this CPU");
  if (!bf16_path_available(layout.bf16))
    throw Error("gemm: bf16 path " + std::string(bf16_path_name(layout.bf16)) + " is not available here");
  if (layout != layout_for_path(n, k, compute, isa, layout.bf16))
    throw Error("gemm: packed panels laid out for another kernel (KC, panel stride or size differ)");
  if (reinterpret_cast<std::uintptr_t>(data) % 64 != 0) throw Error("gemm: packed panels must be 64-byte aligned");
  auto out = std::make_shared<PackedB>();
  out->n = n, out->k = k, out->compute = compute, out->isa = isa, out->bf16 = layout.bf16;
  out->kc = layout.kc, out->panel_stride = layout.panel_stride;
  out->adopted = data;
  out->owner = std::move(owner);
  return out;
}

F32PanelLayout f32_panel_layout(int64_t n, int64_t k, Isa isa) {
  if (n < 1 || k < 1) throw Error("gemm: f32_panel_layout needs n, k >= 1, got " + std::to_string(n) + ", " + std::to_string(k));
  const Plan<float> plan = f32_kernel(isa);
  if (plan.padded(plan.kc) != plan.kc || plan.kgroup != 1 || plan.kc % 8 != 0)
    throw Error("gemm: the f32 kernel's panels are not plain k rows in K blocks of a multiple of 8");
  F32PanelLayout out;
  out.n = n, out.k = k, out.kc = plan.kc, out.nr = plan.nr;
  out.layout = layout_of(plan, n, k, Bf16Path::f32);
  return out;
}

uint64_t packed_b_count() { return packed_b_calls.load(std::memory_order_relaxed); }

std::shared_ptr<const PackedB> pack_b_once(const Problem& p, Isa isa, int threads) {
  return pack_b_once_for(p, isa, pack_path(p.compute, isa, threads));
}

std::size_t packed_b_bytes(int64_t n, int64_t k, Element compute, Isa isa, Bf16Path path) {
  return layout_for_path(n, k, compute, isa, path).bytes;
}

std::shared_ptr<const PackedB> pack_b_once_for(const Problem& p, Isa isa, Bf16Path path) {
  if (!isa_supported(isa)) throw Error("gemm: ISA " + std::string(isa_name(isa)) + " is not supported by this CPU");
  if (p.b_type == Element::i8) throw Error("gemm: an int8 B is packed per call (a packed float copy would defeat its purpose)");
  if (!uses_bf16_kernels(p, isa)) path = Bf16Path::f32;
  if (!bf16_path_available(path)) throw Error("gemm: bf16 path " + std::string(bf16_path_name(path)) + " is not available here");
  packed_b_calls.fetch_add(1, std::memory_order_relaxed);
  auto out = std::make_shared<PackedB>();
  out->n = p.n;
  out->k = p.k;
  out->compute = p.compute;
  out->isa = isa;
  out->bf16 = path;
  // Packing does not depend on MC or NC, only on the kernel and its KC.
  if (path != Bf16Path::f32) pack_all(p, bf16_kernel(path), *out, out->bf16_panels);
  else pack_all(p, f32_kernel(isa), *out, out->f32);
  return out;
}

void sgemm(const Problem& p, Isa isa, int threads) {
  if (p.m <= 0 || p.n <= 0) return;
  sgemm_variant(p, isa, threads, chosen_variant(p, isa, threads));
}

void sgemm_variant(const Problem& p, Isa isa, int threads, const GemmVariant& variant, const CpuCaches& caches) {
  const Bf16Path path = variant.bf16;
  if (!isa_supported(isa)) throw Error("gemm: ISA " + std::string(isa_name(isa)) + " is not supported by this CPU");
  if (path != Bf16Path::f32 && (isa != Isa::avx512 || !bf16_path_available(path)))
    throw Error("gemm: bf16 path " + std::string(bf16_path_name(path)) + " is not available here");
  if (p.m <= 0 || p.n <= 0) return;
  if (p.b_type == Element::i8 && (!p.trans_b || !p.b_scale)) throw Error("gemm: an int8 B must be a weight [N, K] with a column scale");
  if (p.packed_b && (p.packed_b->n != p.n || p.packed_b->k != p.k || p.packed_b->compute != p.compute || p.packed_b->isa != isa))
    throw Error("gemm: the packed B was made for another problem (N, K, compute or ISA differ)");
  if (p.packed_b && p.packed_b->bf16 != (p.compute == Element::bf16 ? path : Bf16Path::f32))
    throw Error("gemm: the packed B was made for another bf16 path");
  const Blocking blocking = blocking_of(variant, isa, caches);
  if (p.compute == Element::bf16 && path != Bf16Path::f32) run_split(p, with_blocking(bf16_kernel(path), blocking), threads);
  else run_split(p, with_blocking(f32_kernel(isa, variant.prefetch), blocking), threads);
}

}  // namespace cubevec::ops::gemm
