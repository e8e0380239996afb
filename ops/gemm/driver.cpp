#include "ops/gemm/driver.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <tbb/parallel_for.h>

#include "ops/gemm/microkernel.h"
#include "tensor/caching_allocator.h"
#include "tensor/error.h"

namespace cubevec::ops::gemm {

namespace {

struct Kernel {
  MicroKernel micro;
  EpilogueFn epilogue;
  int64_t mr, nr, kc, mc, nc;  // register tile and cache blocks
};

Kernel kernel_for(Isa isa) {
  // Cache blocks: the packed A block (MC x KC) within the 1 MiB L2 and the packed B block
  // (KC x NC) within L3. For AVX-512 a long KC measured best on the project machine (4096x3072x3072
  // on 2 threads: KC 256 -> 312 GFLOP/s, 512 -> 377, 768 -> 351-383, 1024 -> 384-389): fewer passes
  // over C outweigh a B micro-panel that no longer fits L1 (it streams from L2 well).
  switch (isa) {
    case Isa::avx512: return {microkernel_avx512, epilogue_avx512, kMrAvx512, kNrAvx512, 768, 14 * 12, 4096};
    case Isa::avx2: return {microkernel_avx2, epilogue_avx2, kMrAvx2, kNrAvx2, 256, 6 * 48, 4096};
    case Isa::portable: return {microkernel_portable, epilogue_portable, kMrPortable, kNrPortable, 256, 4 * 64, 2048};
  }
  throw Error("gemm: invalid ISA");
}

// Workspace from the caching allocator: the same blocks come back call after call, already mapped.
struct Workspace {
  explicit Workspace(std::size_t floats)
      : ptr(static_cast<float*>(default_allocator().allocate(floats * sizeof(float)))) {}
  ~Workspace() { default_allocator().deallocate(ptr); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  float* ptr;
};

// A[i0 .. i0+mc, p0 .. p0+kc] into MR-row panels, k-major, zero-padded to a whole panel.
void pack_a(const Problem& p, const Kernel& kn, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* out) {
  for (int64_t ir = 0; ir < mc; ir += kn.mr) {
    const int64_t rows = std::min(kn.mr, mc - ir);
    for (int64_t k = 0; k < kc; ++k) {
      for (int64_t r = 0; r < rows; ++r) out[r] = p.a[(i0 + ir + r) * p.lda + p0 + k];
      for (int64_t r = rows; r < kn.mr; ++r) out[r] = 0.0f;
      out += kn.mr;
    }
  }
}

// B[p0 .. p0+kc, j0 .. j0+nc] into NR-column panels, k-major, zero-padded to a whole panel.
void pack_b(const Problem& p, const Kernel& kn, int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* out) {
  for (int64_t jr = 0; jr < nc; jr += kn.nr) {
    const int64_t cols = std::min(kn.nr, nc - jr);
    if (!p.trans_b) {
      for (int64_t k = 0; k < kc; ++k) {
        const float* src = p.b + (p0 + k) * p.ldb + j0 + jr;
        std::copy(src, src + cols, out);
        std::fill(out + cols, out + kn.nr, 0.0f);
        out += kn.nr;
      }
    } else {  // B = W^T with W [N, K]: column j of B is row j of W
      for (int64_t k = 0; k < kc; ++k) {
        for (int64_t j = 0; j < cols; ++j) out[j] = p.b[(j0 + jr + j) * p.ldb + p0 + k];
        std::fill(out + cols, out + kn.nr, 0.0f);
        out += kn.nr;
      }
    }
  }
}

// The serial blocked algorithm on rows [row0, row1) and columns [col0, col1) of C.
void sgemm_block(const Problem& p, const Kernel& kn, int64_t row0, int64_t row1, int64_t col0, int64_t col1) {
  const int64_t m = row1 - row0, n = col1 - col0;
  if (m <= 0 || n <= 0) return;
  const int64_t nc_max = std::min(kn.nc, (n + kn.nr - 1) / kn.nr * kn.nr);
  const int64_t mc_max = std::min(kn.mc, (m + kn.mr - 1) / kn.mr * kn.mr);
  const int64_t kc_max = std::min(kn.kc, std::max<int64_t>(p.k, 1));
  Workspace packed_a(static_cast<std::size_t>(mc_max * kc_max)), packed_b(static_cast<std::size_t>(nc_max * kc_max));
  alignas(64) float edge[32 * 32];  // full tile for partial edges (MR, NR <= 32)

  if (p.k == 0) {  // C = 0, then the epilogue
    for (int64_t i = row0; i < row1; ++i) std::fill(p.c + i * p.ldc + col0, p.c + i * p.ldc + col1, 0.0f);
    if (!p.epilogue.empty()) kn.epilogue(p.epilogue, p.c + row0 * p.ldc + col0, p.ldc, row0, col0, m, n);
    return;
  }
  for (int64_t jc = col0; jc < col1; jc += kn.nc) {
    const int64_t nc = std::min(kn.nc, col1 - jc);
    for (int64_t pc = 0; pc < p.k; pc += kn.kc) {
      const int64_t kc = std::min(kn.kc, p.k - pc);
      const bool first = pc == 0, last = pc + kc == p.k;
      pack_b(p, kn, pc, kc, jc, nc, packed_b.ptr);
      for (int64_t ic = row0; ic < row1; ic += kn.mc) {
        const int64_t mc = std::min(kn.mc, row1 - ic);
        pack_a(p, kn, ic, mc, pc, kc, packed_a.ptr);
        for (int64_t jr = 0; jr < nc; jr += kn.nr) {
          const int64_t cols = std::min(kn.nr, nc - jr);
          const float* b_panel = packed_b.ptr + jr * kc;
          for (int64_t ir = 0; ir < mc; ir += kn.mr) {
            const int64_t rows = std::min(kn.mr, mc - ir);
            const float* a_panel = packed_a.ptr + ir * kc;
            float* c_tile = p.c + (ic + ir) * p.ldc + jc + jr;
            if (rows == kn.mr && cols == kn.nr) {
              kn.micro(kc, a_panel, b_panel, c_tile, p.ldc, !first);
            } else {  // edge tile: compute in full, copy the valid part
              for (int64_t r = 0; r < rows && !first; ++r) std::copy(c_tile + r * p.ldc, c_tile + r * p.ldc + cols, edge + r * kn.nr);
              kn.micro(kc, a_panel, b_panel, edge, kn.nr, !first);
              for (int64_t r = 0; r < rows; ++r) std::copy(edge + r * kn.nr, edge + r * kn.nr + cols, c_tile + r * p.ldc);
            }
            if (last && !p.epilogue.empty()) kn.epilogue(p.epilogue, c_tile, p.ldc, ic + ir, jc + jr, rows, cols);
          }
        }
      }
    }
  }
}

}  // namespace

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::avx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
    case Isa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::portable: return true;
  }
  return false;
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::portable: return "portable";
  }
  return "?";
}

Isa best_isa() {
  static const Isa best = [] {
    Isa widest = isa_supported(Isa::avx512) ? Isa::avx512 : isa_supported(Isa::avx2) ? Isa::avx2 : Isa::portable;
    const char* forced = std::getenv("CUBEVEC_GEMM_ISA");
    if (!forced || !*forced) return widest;
    for (Isa isa : {Isa::avx512, Isa::avx2, Isa::portable})
      if (isa_name(isa) == forced) {
        if (!isa_supported(isa)) throw Error(std::string("CUBEVEC_GEMM_ISA=") + forced + ": this CPU does not support it");
        return isa;
      }
    throw Error(std::string("CUBEVEC_GEMM_ISA=") + forced + ": expected one of avx512, avx2, portable");
  }();
  return best;
}

void sgemm(const Problem& p, Isa isa, int threads) {
  if (!isa_supported(isa)) throw Error("gemm: ISA " + std::string(isa_name(isa)) + " is not supported by this CPU");
  const Kernel kn = kernel_for(isa);
  if (p.m <= 0 || p.n <= 0) return;
  // Split the larger side of C into one contiguous part per thread, in whole register tiles.
  const bool by_rows = p.m >= p.n;
  const int64_t extent = by_rows ? p.m : p.n, tile = by_rows ? kn.mr : kn.nr;
  const int64_t parts = std::clamp<int64_t>((extent + tile - 1) / tile, 1, std::max(threads, 1));
  const int64_t per_part = ((extent + parts - 1) / parts + tile - 1) / tile * tile;
  tbb::parallel_for(int64_t{0}, parts, [&](int64_t part) {
    const int64_t lo = part * per_part, hi = std::min(extent, lo + per_part);
    if (by_rows) sgemm_block(p, kn, lo, hi, 0, p.n);
    else sgemm_block(p, kn, 0, p.m, lo, hi);
  });
}

}  // namespace cubevec::ops::gemm
