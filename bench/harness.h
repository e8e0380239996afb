// The benchmark harness: timing with warm-up and repeats, the machine's measured limits, and the
// result rows every suite reports (printed as a table and written as JSON, see docs/performance.md,
// "The benchmark driver").
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ops/gemm/int8.h"

namespace cubevec::bench {

struct Timing {
  double median_s = 0, min_s = 0, max_s = 0;
  int runs = 0;
};

// Runs `body` `warmup` times untimed, then `runs` times timed.
Timing time_runs(const std::function<void()>& body, int runs, int warmup = 1);
Timing summarize(std::vector<double> seconds);

struct Machine {
  std::string isa;                  // "avx512f" or "avx2"
  int threads = 1;                  // threads used for the "all cores" figures
  double fma_peak_gflops = 0;       // f32 FMA peak, all threads
  double fma_peak_1t_gflops = 0;    // one thread
  double triad_gbps = 0;            // STREAM-style triad bandwidth, all threads
  double vnni_peak_gops = 0;        // AVX512-VNNI int8 peak (2 ops per product), all threads; 0 without it
  double bf16_dot_peak_gflops = 0;  // AVX512-BF16 vdpbf16ps peak, all threads; 0 without it
  double amx_peak_gflops = 0;       // AMX-BF16 tdpbf16ps peak, all threads; 0 without it
  double amx_int8_peak_gops = 0;    // AMX-INT8 tdpbusd peak (2 ops per product), all threads; 0 without it
  double madd16_peak_gops = 0;      // AVX2 vpmaddwd + vpaddd peak (2 ops per product), all threads; 0 without AVX2
  // The int8 peak of `kernel`'s instructions (0 for the portable kernel, and for AVX-VNNI, whose
  // peak is not measured).
  double int8_peak_gops(ops::gemm::Int8Isa kernel) const {
    switch (kernel) {
      case ops::gemm::Int8Isa::amx: return amx_int8_peak_gops;
      case ops::gemm::Int8Isa::avx512_vnni: return vnni_peak_gops;
      case ops::gemm::Int8Isa::avx2: return madd16_peak_gops;
      case ops::gemm::Int8Isa::avx_vnni:
      case ops::gemm::Int8Isa::portable: return 0;
    }
    return 0;
  }
};

// Measures FMA peak (with the widest vectors the CPU has) and triad bandwidth; takes ~2 s.
Machine measure_machine();
// The FMA peak (GFLOP/s) of `threads` threads running at once (about 0.3 s).
double fma_peak_gflops_at(int threads);

struct Result {
  Result(std::string suite_name, std::string case_text, std::string impl_name)
      : suite(std::move(suite_name)), case_name(std::move(case_text)), impl(std::move(impl_name)) {}
  std::string suite, case_name, impl, dtype = "f32";
  Timing timing;
  double gflops = 0, gbps = 0, peak_fraction = 0;  // 0 when not meaningful for the case
  std::map<std::string, double> extra;             // suite-specific figures (speedups, ...)
};

struct Context {
  Machine machine;
  int repeats = 5;
  std::vector<Result> results;
  void add(Result r);  // prints the row as it is added
};

using Suite = std::function<void(Context&)>;

void attention_suite(Context& context);
void blocks_suite(Context& context);
void scaling_suite(Context& context);
void quant_suite(Context& context);
void sparse_suite(Context& context);
void parse_suite(Context& context);
void cache_suite(Context& context);
void launch_suite(Context& context);
void cv_suite(Context& context);
void instances_suite(Context& context);
void gemm_suite(Context& context);
void vector_suite(Context& context);
void vae_suite(Context& context);
void text_suite(Context& context);
void memory_suite(Context& context);
void parallel_suite(Context& context);  // under mpirun -np 2
void pipeline_suite(Context& context);
void pipeline_flux_suite(Context& context);  // the same on a model of FLUX.1's width (writes it once, about 2 GB)
void api_suite(Context& context);            // the library's load-once against a process per request
void serve_suite(Context& context);          // cubevec serve: instances against processes (and the packed cache), a leak check
void serve_flux_suite(Context& context);     // the same on a model of FLUX.1's width (writes it once, about 2 GB)
void python_ops_suite(Context& context);     // the C++ side of bench/python_overhead.py
void images_suite(Context& context);         // the VAE encoder against the decoder, image-to-image against text-to-image

}  // namespace cubevec::bench
