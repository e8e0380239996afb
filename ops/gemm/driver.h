// cubevec's own f32 GEMM: packing, cache blocking and threads around the ISA's micro-kernel
// (BLIS-style loops: NC columns of B in L3, KC x NC packed B, MC x KC packed A in L2, one NR-wide
// B micro-panel in L1 while the micro-kernel walks the MR-row panels of A).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ops/gemm/cpu_caches.h"
#include "ops/gemm/epilogue.h"
#include "ops/gemm/int8.h"
#include "ops/isa.h"
#include "tensor/allocated_array.h"

namespace cubevec::ops::gemm {

using ops::Isa;
using ops::isa_name;
using ops::isa_supported;

// The widest ISA this CPU runs; CUBEVEC_GEMM_ISA=avx2|portable lowers it (for testing and
// comparison), read once. Throws on an unknown or unsupported value.
Isa best_isa();

// Element types of the inputs: f32, bf16 stored as uint16_t, or (B only, a weight-only quantized
// Linear) int8 times a per-column scale.
enum class Element : uint8_t { f32, bf16, i8 };

struct PackedB;

// How bf16 compute runs: AMX-BF16 tiles, AVX512-BF16 dot products, or the f32 kernel on the
// rounded values. All sum the bf16 products in f32.
enum class Bf16Path : uint8_t { amx, dot, f32 };

struct Problem {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;  // [M, K], row stride lda
  int64_t lda = 0;
  Element a_type = Element::f32;
  const void* b = nullptr;  // [K, N] with row stride ldb, or, if trans_b, [N, K] (a Linear weight)
  int64_t ldb = 0;
  Element b_type = Element::f32;
  const float* b_scale = nullptr;  // [N], with b_type i8: B's column j is read as int8 x b_scale[j]
  bool trans_b = false;
  float* c = nullptr;  // [M, N], row stride ldc, always f32
  int64_t ldc = 0;
  // bf16: the inputs are rounded to bf16 and their products summed in f32 (AVX512-BF16 dot
  // products where the CPU has them, else the f32 kernel on the rounded values).
  Element compute = Element::f32;
  Epilogue epilogue;
  // B already packed by pack_b_once (then b and ldb are not read). Must match n, k, compute, b's
  // layout and the ISA sgemm runs with.
  const PackedB* packed_b = nullptr;
};

// B packed once into the micro-kernel's panel layout, for a B that does not change between calls
// (a model's weights): every call then skips packing B, which otherwise each thread redoes per call.
// The panels are in the caching allocator, or in memory someone else owns (a packed cache file
// mapped read-only and shared between processes, kept alive by `owner`).
struct PackedB {
  int64_t n = 0, k = 0;
  Element compute = Element::f32;
  Isa isa = Isa::portable;
  Bf16Path bf16 = Bf16Path::f32;     // the bf16 kernel the panels are for (f32: the f32 kernels)
  int64_t kc = 0, panel_stride = 0;  // K block size; elements per K block (all N panels)
  // The panels, in the caching allocator (counted in its peak and under its limit).
  AllocatedArray<float> f32;             // f32 kernels
  AllocatedArray<uint16_t> bf16_panels;  // bf16-pair kernels: AVX512-BF16 or AMX
  // Or panels made earlier (adopt_packed_b): then the arrays above are empty.
  const void* adopted = nullptr;
  std::shared_ptr<const void> owner;

  const float* f32_data() const { return adopted ? static_cast<const float*>(adopted) : f32.data(); }
  const uint16_t* bf16_data() const { return adopted ? static_cast<const uint16_t*>(adopted) : bf16_panels.data(); }
  // The panels' bytes (what a packed cache file stores).
  std::size_t bytes() const;
  const void* data() const { return bf16 != Bf16Path::f32 ? static_cast<const void*>(bf16_data()) : f32_data(); }
};

// How pack_b_once would lay out an [N, K] weight now: the bf16 kernel the calibration chooses for
// large shapes on `threads` threads (0: the calling arena's), its KC, the panel stride and bytes.
struct PackedLayout {
  Bf16Path bf16 = Bf16Path::f32;
  int64_t kc = 0, panel_stride = 0;
  std::size_t bytes = 0;
  bool operator==(const PackedLayout&) const = default;
};
PackedLayout packed_layout(int64_t n, int64_t k, Element compute, Isa isa, int threads = 0);
// Panels made earlier with `layout` (a packed cache file's mapping), used in place: `data` holds
// layout.bytes bytes, 64-byte aligned, and stays valid while `owner` lives. Throws when the
// layout is not what this CPU packs for (n, k, compute, isa) on that bf16 path.
std::shared_ptr<const PackedB> adopt_packed_b(int64_t n, int64_t k, Element compute, Isa isa, const PackedLayout& layout, const void* data,
                                              std::shared_ptr<const void> owner);
// How many times this process has packed a B (pack_b_once / pack_b_once_for): reports show that a
// mapped packed cache left nothing to pack.
uint64_t packed_b_count();

// Packs p's B (p.b, ldb, b_type, trans_b, n, k, compute) for sgemm with `isa`, for the bf16 kernel
// the calibration chose for large shapes on `threads` threads (0: the calling arena's).
std::shared_ptr<const PackedB> pack_b_once(const Problem& p, Isa isa, int threads = 0);
// The bytes pack_b_once allocates for an [N, K] weight on `path` (the last K block is padded to a
// whole KC block, every N panel to NR columns): what a memory estimate counts before packing.
std::size_t packed_b_bytes(int64_t n, int64_t k, Element compute, Isa isa, Bf16Path path);
// Packs for a given bf16 kernel (tests, benchmarks); the path must be available.
std::shared_ptr<const PackedB> pack_b_once_for(const Problem& p, Isa isa, Bf16Path path);

// The f32 panels pack_b_once lays out for a [K, N] B on `isa`, for a caller that writes them itself
// (a convolution's im2col writes its columns straight into them instead of into a matrix that
// sgemm would then copy into panels): B's element (row, col) goes to offset(row, col) of an array
// of floats() floats, 64-byte aligned; adopt_packed_b(n, k, Element::f32, isa, layout, ...) then
// hands the array to sgemm. Columns col .. col + run - 1 are adjacent while they stay in one panel
// (run <= nr - col % nr); the columns past N in the last panel are read by the micro-kernel and
// must be finite (zero). KC is a multiple of 8.
struct F32PanelLayout {
  int64_t n = 0, k = 0, kc = 0, nr = 0;
  PackedLayout layout;
  std::size_t floats() const { return layout.bytes / sizeof(float); }
  int64_t offset(int64_t row, int64_t col) const {
    const int64_t block = row / kc, depth = std::min(kc, k - block * kc);  // the K block's depth (the last may be short)
    return block * layout.panel_stride + (col / nr) * depth * nr + (row % kc) * nr + col % nr;
  }
};
F32PanelLayout f32_panel_layout(int64_t n, int64_t k, Isa isa);

// Runs on the calling thread's TBB arena, splitting the work over up to `threads` tasks, with the
// variant the calibration (GemmTuner) chose for this ISA, shape class and thread count.
void sgemm(const Problem& p, Isa isa, int threads);

// One way to run a GEMM: the kernel (bf16 compute: which bf16 path; f32 compute: f32), the share
// of the L2 cache the packed A block fills, and for the f32 AVX-512 kernel whether it prefetches.
// The calibration measures these against each other; the share and the prefetch change only the
// blocking and the memory traffic, so the same kernel gives the same bits under each. An int8
// GEMM's variant names its int8 kernel instead (`int8`; then `bf16` stays f32).
struct GemmVariant {
  Bf16Path bf16 = Bf16Path::f32;
  int l2_share = 2;                            // the A block takes L2 / l2_share
  bool prefetch = false;                       // the f32 AVX-512 kernel's software prefetch (same bits either way)
  std::optional<Int8Isa> int8 = std::nullopt;  // the int8 family's kernel
  bool operator==(const GemmVariant&) const = default;
  std::string name() const;              // "amx L2/8", "f32 L2/4 prefetch", "avx512_vnni L2/2"
  std::string_view kernel_name() const;  // "amx", "f32", "avx512_vnni"
};
// The cache blocks of a variant: KC is fixed per kernel (packed B panels depend on it and the
// summation order with it), MC from the L2 share, NC (B packed per call) from the L3.
struct Blocking {
  int64_t kc = 0, mc = 0, nc = 0;
};
Blocking blocking_of(const GemmVariant& variant, Isa isa, const CpuCaches& caches);
// sgemm with a given variant and caches (calibration, tests, benchmarks); its path must be available.
void sgemm_variant(const Problem& p, Isa isa, int threads, const GemmVariant& variant, const CpuCaches& caches = this_cpu_caches());

// True when the CPU has AVX512-BF16 dot products.
bool has_bf16_dot();
// True when AMX-BF16 tiles can run in this process: the CPU's own (Linux granted the tile state),
// or the tile model while it is on (below).
bool amx_ready();
// True when the CPU has AMX-BF16 and Linux granted this process the tile state.
bool amx_native();
// The AMX tile model (ops/gemm/amx_model.h) in place of the CPU's tiles: every AMX kernel then
// runs the same code on plain C++ tiles, far slower, on any CPU with AVX512-BF16 (what the kernels'
// non-tile parts need). On from the start with CUBEVEC_AMX_MODEL=1 (any other value but 0 or empty
// is an Error), or switched by use_amx_model (tests; an Error where the CPU lacks AVX512-BF16).
// The calibration never measures the model (its speed says nothing about AMX's): a GEMM runs it
// only where AMX is named (CUBEVEC_GEMM_BF16=amx, CUBEVEC_INT8_ISA=amx, a variant or packing that
// names it); the attention's bf16 and int8 tiles prefer it as they prefer real AMX.
bool amx_model_on();
void use_amx_model(bool on);
// The bf16 path CUBEVEC_GEMM_BF16=amx|avx512bf16|f32 forces (read once; an unavailable or unknown
// one is an Error), or nullopt: the calibration chooses.
std::optional<Bf16Path> forced_bf16_path();
std::string_view bf16_path_name(Bf16Path path);  // "amx", "avx512bf16", "f32"
std::optional<Bf16Path> parse_bf16_path(std::string_view name);
bool bf16_path_available(Bf16Path path);

}  // namespace cubevec::ops::gemm
