#include <cpuid.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <tbb/parallel_for.h>

#include "ops/gemm/int8.h"
#include "ops/gemm/tuner.h"
#include "tensor/caching_allocator.h"
#include "base/enum_names.h"
#include "base/error.h"

namespace cubevec::ops::gemm {

namespace {

constexpr auto kInt8IsaNames = enum_names<Int8Isa>("int8 ISA", {{Int8Isa::amx, "amx"},
                                                                {Int8Isa::avx512_vnni, "avx512_vnni"},
                                                                {Int8Isa::avx_vnni, "avx_vnni"},
                                                                {Int8Isa::avx2, "avx2"},
                                                                {Int8Isa::portable, "portable"}});

struct Int8Plan {
  void (*micro)(int64_t, const uint8_t*, const int8_t*, int32_t*, int64_t);
  void (*epilogue)(const Int8Output&, const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t);
  int mr, nr;
  bool a_in_k_blocks;  // A packed [k_quads / 16][MR][64] (AMX tiles) instead of [k_quads][MR][4]
  bool a_u16 = false;  // A's packed values widened to u16 (the AVX2 kernel's vpmaddwd takes 16-bit lanes)
  int64_t a_value_bytes() const { return a_u16 ? 2 : 1; }
};

Int8Plan plan_of(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::amx:
      if (!int8_isa_supported(isa)) throw Error("int8 GEMM: the AMX-INT8 kernel is not available on this CPU");
      return {amx_model_on() ? amx_model::int8_microkernel_amx : int8_microkernel_amx, int8_epilogue_avx512, kMrInt8Amx, kNrInt8Amx, true};
    case Int8Isa::avx512_vnni: return {int8_microkernel_avx512_vnni, int8_epilogue_avx512, kMrInt8Avx512, kNrInt8Avx512, false};
    case Int8Isa::avx_vnni: return {int8_microkernel_avx_vnni, int8_epilogue_avx2, kMrInt8AvxVnni, kNrInt8AvxVnni, false};
    case Int8Isa::avx2: return {int8_microkernel_avx2, int8_epilogue_avx2, kMrInt8Avx2, kNrInt8Avx2, false, true};
    case Int8Isa::portable: return {int8_microkernel_portable, int8_epilogue_portable, kMrInt8Portable, kNrInt8Portable, false};
  }
  throw Error("int8 GEMM: invalid ISA");
}

constexpr int64_t kMinBlockRows = 24;

// Scratch from the caching allocator: the same blocks come back call after call.
template <class T>
struct Scratch {
  explicit Scratch(std::size_t count) : ptr(static_cast<T*>(default_allocator().allocate(std::max<std::size_t>(count, 1) * sizeof(T)))) {}
  ~Scratch() { default_allocator().deallocate(ptr); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* ptr;
};

// Rows [i0, i0 + rows) of A into MR-row panels, rows past the end as the s8 zero (128): their
// results are computed and dropped. Each panel is [k_quads][MR][4] for the VNNI kernels (run = 1),
// or in k blocks of 16 quads, [k_quads / 16][MR][64], for the AMX tiles (run = 16); T = uint16_t
// widens each byte for the AVX2 kernel's vpmaddwd.
template <class T>
void pack_a_panels(const uint8_t* a, int64_t lda, int64_t kq, int64_t mr, int64_t run, int64_t i0, int64_t rows, T* out) {
  for (int64_t ir = 0; ir < rows; ir += mr, out += kq * 4 * mr) {
    const int64_t n = std::min<int64_t>(mr, rows - ir);
    if (n < mr) std::fill(out, out + kq * 4 * mr, T{128});
    for (int64_t r = 0; r < n; ++r) {
      const uint8_t* src = a + (i0 + ir + r) * lda;
      for (int64_t q = 0; q < kq; q += run) {
        T* dst = out + (q * mr + r * run) * 4;
        if constexpr (sizeof(T) == 1) std::memcpy(dst, src + 4 * q, static_cast<std::size_t>(4 * run));
        else std::copy(src + 4 * q, src + 4 * (q + run), dst);
      }
    }
  }
}

void pack_a(const uint8_t* a, int64_t lda, const Int8Problem& p, const Int8Plan& plan, int64_t i0, int64_t rows, uint8_t* out) {
  const int64_t kq = p.b->k_quads, run = plan.a_in_k_blocks ? kKQuadsPerAmxBlock : 1;  // quads copied together
  if (plan.a_u16) pack_a_panels(a, lda, kq, plan.mr, run, i0, rows, reinterpret_cast<uint16_t*>(out));
  else pack_a_panels(a, lda, kq, plan.mr, run, i0, rows, out);
}

// C rows [row0, row1) x panels [panel0, panel1), in A blocks of mc rows. With quantize_rows, each
// block is quantized into a row-major scratch that stays in cache, then packed from there; the
// part keeps its own row scales (parts split by panels quantize the same rows, each for itself).
void run_part(const Int8Problem& p, const Int8Plan& plan, int64_t mc, int64_t row0, int64_t row1, int64_t panel0, int64_t panel1) {
  const int64_t kq = p.b->k_quads, k_bytes = 4 * kq;
  Int8Output output{p.c, p.ldc, p.b->column_sums.data(), p.epilogue};
  const int64_t a_row_bytes = k_bytes * plan.a_value_bytes();  // a packed row
  Scratch<uint8_t> a_block(static_cast<std::size_t>(mc * a_row_bytes));
  const bool fused = static_cast<bool>(p.quantize_rows);
  Scratch<uint8_t> quantized(fused ? static_cast<std::size_t>(mc * k_bytes) : 0);
  Scratch<float> row_scales(fused ? static_cast<std::size_t>(p.m) : 0);  // indexed by the global row
  if (fused) output.epilogue.row_scale = row_scales.ptr;
  alignas(64) int32_t tile[32 * 32];
  for (int64_t ic = row0; ic < row1; ic += mc) {
    const int64_t rows = std::min(mc, row1 - ic);
    if (fused) {
      p.quantize_rows(ic, ic + rows, quantized.ptr, k_bytes, row_scales.ptr + ic);
      pack_a(quantized.ptr, k_bytes, p, plan, 0, rows, a_block.ptr);
    } else {
      pack_a(p.a, p.lda, p, plan, ic, rows, a_block.ptr);
    }
    for (int64_t jp = panel0; jp < panel1; ++jp) {
      const int8_t* b_panel = p.b->panels.data() + jp * kq * 4 * plan.nr;
      const int64_t j0 = jp * plan.nr, cols = std::min<int64_t>(plan.nr, p.n - j0);
      for (int64_t ir = 0; ir < rows; ir += plan.mr) {
        plan.micro(kq, a_block.ptr + ir * a_row_bytes, b_panel, tile, plan.nr);
        plan.epilogue(output, tile, plan.nr, ic + ir, j0, std::min<int64_t>(plan.mr, rows - ir), cols);
      }
    }
  }
}

}  // namespace

// AVX-VNNI is CPUID leaf 7, sub-leaf 1, EAX bit 4 (clang 14's __builtin_cpu_supports does not know it).
static bool has_avx_vnni() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 4) & 1u) != 0;
}

// AMX-INT8 is CPUID leaf 7, EDX bit 25; the tile state itself comes from amx_ready().
static bool has_amx_int8() {
  static const bool has = [] {  // read once: plan_of asks on every AMX GEMM, and CPUID traps to a VM's hypervisor
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 25) & 1u) != 0;
  }();
  return has;
}

bool int8_isa_supported(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::amx: return amx_model_on() || (has_amx_int8() && amx_native());
    case Int8Isa::avx512_vnni:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
    case Int8Isa::avx_vnni: return __builtin_cpu_supports("avx2") && has_avx_vnni();
    case Int8Isa::avx2: return __builtin_cpu_supports("avx2");
    case Int8Isa::portable: return true;
  }
  return false;
}

std::string_view int8_isa_name(Int8Isa isa) { return kInt8IsaNames.name(isa); }

std::optional<Int8Isa> parse_int8_isa(std::string_view name) {
  if (!kInt8IsaNames.contains(name)) return std::nullopt;
  return kInt8IsaNames.parse(name);
}

std::optional<Int8Isa> forced_int8_isa() {
  static const std::optional<Int8Isa> forced = []() -> std::optional<Int8Isa> {
    const char* env = std::getenv("CUBEVEC_INT8_ISA");
    if (!env || !*env) return std::nullopt;
    const auto isa = parse_int8_isa(env);
    if (!isa)
      throw Error("CUBEVEC_INT8_ISA=" + text_for_message(env) + ": unknown int8 ISA (expected one of: " + kInt8IsaNames.list() + ")");
    if (!int8_isa_supported(*isa)) throw Error("CUBEVEC_INT8_ISA=" + text_for_message(env) + ": this CPU does not support that ISA");
    return isa;
  }();
  return forced;
}

Int8Isa best_int8_isa() {
  static const Int8Isa best = [] {
    if (const auto forced = forced_int8_isa()) return *forced;
    for (Int8Isa isa : {Int8Isa::amx, Int8Isa::avx512_vnni, Int8Isa::avx_vnni, Int8Isa::avx2})
      if (int8_isa_supported(isa) && !(isa == Int8Isa::amx && amx_model_on())) return isa;  // the model only where named
    return Int8Isa::portable;
  }();
  return best;
}

int64_t int8_k_quads(int64_t k, Int8Isa isa) {
  const int64_t quads = (k + 3) / 4;
  return isa == Int8Isa::amx ? (quads + kKQuadsPerAmxBlock - 1) / kKQuadsPerAmxBlock * kKQuadsPerAmxBlock : quads;
}

std::shared_ptr<const PackedInt8> pack_int8_weight(const int8_t* w, int64_t n, int64_t k, int64_t ldw, Int8Isa isa) {
  if (!int8_isa_supported(isa)) throw Error("int8 GEMM: ISA " + std::string(int8_isa_name(isa)) + " is not supported by this CPU");
  if (n < 1 || k < 1 || ldw < k)
    throw Error("pack_int8_weight: expected a weight [N, K] with N, K >= 1, got N " + std::to_string(n) + ", K " + std::to_string(k));
  auto out = std::make_shared<PackedInt8>();
  const Int8Plan plan = plan_of(isa);
  out->n = n, out->k = k, out->k_quads = int8_k_quads(k, isa), out->isa = isa, out->nr = plan.nr;
  const int64_t panels = (n + plan.nr - 1) / plan.nr, kq = out->k_quads, nr = plan.nr, panel_bytes = kq * 4 * nr;
  out->panels.assign_for_overwrite(static_cast<std::size_t>(panels * panel_bytes));
  out->column_sums.assign_for_overwrite(static_cast<std::size_t>(n));
  // Panel by panel in parallel (this is most of a W8A8 model's load): each column's row moved one
  // quad (4 bytes) at a time to its place, the padding (K past its end, columns past N) zeroed.
  tbb::parallel_for(int64_t{0}, panels, [&](int64_t panel) {
    int8_t* dst = out->panels.data() + panel * panel_bytes;
    const int64_t j0 = panel * nr;
    for (int64_t col = 0; col < nr; ++col) {
      int8_t* d = dst + col * 4;
      if (j0 + col >= n) {
        for (int64_t q = 0; q < kq; ++q) std::memset(d + q * 4 * nr, 0, 4);
        continue;
      }
      const int8_t* src = w + (j0 + col) * ldw;
      int64_t q = 0;
      for (; q < k / 4; ++q) std::memcpy(d + q * 4 * nr, src + 4 * q, 4);
      for (; q < kq; ++q) {
        int8_t quad[4] = {};
        for (int64_t t = 0; t < 4 && 4 * q + t < k; ++t) quad[t] = src[4 * q + t];
        std::memcpy(d + q * 4 * nr, quad, 4);
      }
      int32_t sum = 0;
      for (int64_t kk = 0; kk < k; ++kk) sum += src[kk];
      out->column_sums[static_cast<std::size_t>(j0 + col)] = sum;
    }
  });
  return out;
}

void gemm_int8(const Int8Problem& p, int threads) {
  if (p.m <= 0 || p.n <= 0) return;
  if (!p.b) throw Error("gemm_int8: no packed weight");
  gemm_int8_variant(p, threads, int8_l2_share(p.b->isa, p.m, threads));
}

void gemm_int8_variant(const Int8Problem& p, int threads, int l2_share, const CpuCaches& caches) {
  if (p.m <= 0 || p.n <= 0) return;
  if (!p.b || p.b->n != p.n)
    throw Error("gemm_int8: the packed weight has " + std::to_string(p.b ? p.b->n : 0) + " columns, expected " + std::to_string(p.n));
  if (!int8_isa_supported(p.b->isa)) throw Error("gemm_int8: the weight was packed for an ISA this CPU lacks");
  const Int8Plan plan = plan_of(p.b->isa);
  const int64_t panels = (p.n + plan.nr - 1) / plan.nr;
  // Split the larger side into one contiguous part per thread, in whole tiles.
  const bool by_rows = (p.m + plan.mr - 1) / plan.mr >= panels;
  const int64_t extent = by_rows ? (p.m + plan.mr - 1) / plan.mr : panels;
  const int64_t parts = std::clamp<int64_t>(extent, 1, std::max(threads, 1));
  const int64_t per_part = (extent + parts - 1) / parts;
  // The A block stays in its share of the L2 while every B panel of the part passes over it.
  const int64_t k_bytes = 4 * p.b->k_quads, share = std::max(l2_share, 1);
  const int64_t a_row_bytes = std::max<int64_t>(k_bytes * plan.a_value_bytes(), 1);
  // At least kMinBlockRows rows: every B panel of the part streams past each A block, and with fewer
  // rows a block does too few int8 products per B byte for DRAM to feed once B outgrows the L3 (a
  // Zen 3's 512 KiB L2 at 1/8 held 6 u16 rows of K = 3072: 4096 x 12288 x 3072 ran at 0.75x).
  const int64_t min_rows = (kMinBlockRows + plan.mr - 1) / plan.mr * plan.mr;
  const int64_t mc =
      std::clamp<int64_t>(caches.l2 / share / a_row_bytes / plan.mr * plan.mr, min_rows, std::max<int64_t>(64 * plan.mr, min_rows));
  if (p.quantize_rows && !by_rows && parts > 1) {
    // Split by panels, every part would quantize all the rows: quantize them once, in parallel,
    // into a scratch the parts share (few rows: this is the skinny case).
    Scratch<uint8_t> quantized(static_cast<std::size_t>(p.m * k_bytes));
    Scratch<float> row_scales(static_cast<std::size_t>(p.m));
    const int64_t chunk = (p.m + parts - 1) / parts;
    tbb::parallel_for(int64_t{0}, parts, [&](int64_t part) {
      const int64_t r0 = part * chunk, r1 = std::min(p.m, r0 + chunk);
      if (r0 < r1) p.quantize_rows(r0, r1, quantized.ptr + r0 * k_bytes, k_bytes, row_scales.ptr + r0);
    });
    Int8Problem shared = p;
    shared.quantize_rows = nullptr;
    shared.a = quantized.ptr, shared.lda = k_bytes, shared.epilogue.row_scale = row_scales.ptr;
    gemm_int8_variant(shared, threads, l2_share, caches);
    return;
  }
  tbb::parallel_for(int64_t{0}, parts, [&](int64_t part) {
    const int64_t lo = part * per_part, hi = std::min(extent, lo + per_part);
    if (lo >= hi) return;
    if (by_rows) run_part(p, plan, mc, lo * plan.mr, std::min(p.m, hi * plan.mr), 0, panels);
    else run_part(p, plan, mc, 0, p.m, lo, hi);
  });
}

}  // namespace cubevec::ops::gemm
