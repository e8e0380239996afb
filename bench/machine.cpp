// The machine's own limits, measured: f32 FMA peak with many independent accumulator chains
// (enough to cover the FMA latency on two ports), the int8 VNNI, AVX2 vpmaddwd, bf16 dot product
// and AMX-BF16 peaks where the CPU has them, and STREAM-style triad bandwidth.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "bench/harness.h"
#include "device/device_profile.h"
#include "ops/gemm/driver.h"

namespace cubevec::bench {

float amx_loop(long iterations);     // machine_amx.cpp
int amx_int8_loop(long iterations);  // machine_amx.cpp

namespace {

constexpr int kChains = 12;

__attribute__((target("avx512f"))) float fma_loop_avx512(long iterations) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  float lanes[16];
  _mm512_storeu_ps(lanes, sum);
  float total = 0;
  for (float v : lanes) total += v;
  return total;
}

__attribute__((target("avx2,fma"))) float fma_loop_avx2(long iterations) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(0.001f * static_cast<float>(c));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  float lanes[8];
  _mm256_storeu_ps(lanes, sum);
  float total = 0;
  for (float v : lanes) total += v;
  return total;
}

// vpdpbusd chains: each instruction is 16 lanes x 4 u8 x s8 products added (128 int ops).
__attribute__((target("avx512f,avx512vnni"))) int vnni_loop_avx512(long iterations) {
  __m512i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_epi32(c);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
  __m512i sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_epi32(sum, acc[c]);
  int lanes[16];
  _mm512_storeu_si512(lanes, sum);
  int total = 0;
  for (int v : lanes) total += v;
  return total;
}

// The AVX2 int8 kernel's instruction pair in chains: vpmaddwd (8 lanes x 2 16-bit products) and
// vpaddd into the accumulator, 32 int ops a pair (CPUs without VNNI have no fused form).
__attribute__((target("avx2"))) int madd16_loop_avx2(long iterations) {
  __m256i acc[kChains];
#pragma GCC unroll 12
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_epi32(c);
  const __m256i a = _mm256_set1_epi16(3), b = _mm256_set1_epi16(-2);
  for (long i = 0; i < iterations; ++i) {
    // As the kernel issues them (int8_microkernel_avx2.cpp); from intrinsics GCC computes the
    // product of the same inputs once for all chains.
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) {
      __m256i product;
      __asm__("vpmaddwd %[b], %[a], %[t]\n\tvpaddd %[t], %[acc], %[acc]" : [acc] "+x"(acc[c]), [t] "=x"(product) : [a] "x"(a), [b] "x"(b));
    }
  }
  __m256i sum = acc[0];
#pragma GCC unroll 12
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_epi32(sum, acc[c]);
  int lanes[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), sum);
  int total = 0;
  for (int v : lanes) total += v;
  return total;
}

// vdpbf16ps chains: each instruction is 16 lanes x 2 bf16 products added (64 flops).
__attribute__((target("avx512f,avx512bf16"))) float bf16_dot_loop(long iterations) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(0.001f * static_cast<float>(c));
  __m512bh a, b;  // bf16 1.0 and 2^-24, bit patterns (no conversion intrinsic needed)
  const __m512i one = _mm512_set1_epi16(0x3f80), tiny = _mm512_set1_epi16(0x3380);
  std::memcpy(&a, &one, sizeof a);
  std::memcpy(&b, &tiny, sizeof b);
  for (long i = 0; i < iterations; ++i)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  float lanes[16];
  _mm512_storeu_ps(lanes, sum);
  return lanes[0] + lanes[15];
}

// The rate (G ops/s) of `threads` threads each running `loop(iterations)`, which does
// `ops_per_iteration` operations per iteration; the best of 3 tries.
template <class Loop>
double peak_rate(int threads, long iterations, double ops_per_iteration, Loop loop) {
  double best = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<std::thread> pool;
    std::vector<double> sink(static_cast<std::size_t>(threads));
    const auto start = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { sink[static_cast<std::size_t>(t)] = static_cast<double>(loop(iterations)); });
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, ops_per_iteration * static_cast<double>(iterations) * threads / s / 1e9);
  }
  return best;
}

// Int8 GOP/s (a multiply and an add per u8 x s8 product) of the VNNI loop.
double vnni_gops(int threads) { return peak_rate(threads, 20'000'000, kChains * 16 * 4 * 2, vnni_loop_avx512); }

// GFLOP/s of the FMA loop.
double fma_gflops(bool avx512, int threads) {
  if (avx512) return peak_rate(threads, 20'000'000, kChains * 16 * 2, fma_loop_avx512);
  return peak_rate(threads, 20'000'000, kChains * 8 * 2, fma_loop_avx2);
}

double triad_gbps(int threads) {
  const std::size_t n = 24 << 20;  // 3 arrays x 96 MiB: far beyond any cache
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  double best = 0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    std::vector<std::thread> pool;
    const auto start = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const std::size_t lo = n * t / threads, hi = n * (t + 1) / threads;
        for (std::size_t i = lo; i < hi; ++i) a[i] = b[i] + 3.0f * c[i];
      });
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 3.0 * sizeof(float) * static_cast<double>(n) / s / 1e9);
  }
  return best;
}

}  // namespace

double fma_peak_gflops_at(int threads) { return fma_gflops(__builtin_cpu_supports("avx512f"), std::max(threads, 1)); }

Machine measure_machine() {
  Machine m;
  const bool avx512 = __builtin_cpu_supports("avx512f");
  m.isa = avx512 ? "avx512f" : "avx2";
  // The cores this process may use (taskset, a container's cpuset, mpirun's share), as the units
  // are sized: a run under `taskset -c 0` measures one thread against a one-core peak.
  m.threads = machine_unit_threads();
  m.fma_peak_1t_gflops = fma_gflops(avx512, 1);
  m.fma_peak_gflops = fma_gflops(avx512, m.threads);
  m.triad_gbps = triad_gbps(m.threads);
  if (avx512 && __builtin_cpu_supports("avx512vnni")) m.vnni_peak_gops = vnni_gops(m.threads);
  if (ops::gemm::int8_isa_supported(ops::gemm::Int8Isa::avx2))
    m.madd16_peak_gops = peak_rate(m.threads, 20'000'000, kChains * 8 * 2 * 2, madd16_loop_avx2);
  if (ops::gemm::has_bf16_dot()) m.bf16_dot_peak_gflops = peak_rate(m.threads, 20'000'000, kChains * 16 * 2 * 2, bf16_dot_loop);
  // The CPU's own tiles only: these loops are tile instructions (the model, CUBEVEC_AMX_MODEL=1, has no peak).
  if (ops::gemm::amx_native()) m.amx_peak_gflops = peak_rate(m.threads, 2'000'000, 4 * 16 * 16 * 32 * 2, amx_loop);
  if (ops::gemm::amx_native() && ops::gemm::int8_isa_supported(ops::gemm::Int8Isa::amx))
    m.amx_int8_peak_gops = peak_rate(m.threads, 2'000'000, 4 * 16 * 16 * 64 * 2, amx_int8_loop);
  return m;
}

}  // namespace cubevec::bench
