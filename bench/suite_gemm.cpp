// Suite `gemm`: f32 GEMM at DiT sizes. cubevec (its own micro-kernels, on a Cube unit with one
// thread per core), OpenBLAS as the environment configures it (its own threads, OPENBLAS_CORETYPE
// as set), and Eigen (split over the same Cube threads), in the same run.
#include <cblas.h>

#include <random>
#include <thread>

#include "bench/harness.h"
#include "ops/gemm.h"
#include "tensor/half.h"

namespace cubevec::bench {

namespace {

Tensor to_bf16(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::bf16);
  convert_f32_to_bf16(t.data<float>(), out.mutable_data<uint16_t>(), static_cast<std::size_t>(t.numel()));
  return out;
}

Tensor random_matrix(int64_t rows, int64_t cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (float& x : v) x = dist(rng);
  return Tensor::from_vector(v, {rows, cols});
}

}  // namespace

void gemm_suite(Context& context) {
  const int threads = context.machine.threads;
  DeviceProfile profile = builtin_cpu_profile();
  profile.cube_threads = threads;
  Device device(profile);
  const Stream stream = device.new_stream("gemm");
  const int64_t shapes[][3] = {{4096, 3072, 3072}, {4096, 12288, 3072}, {4608, 9216, 3072}, {1024, 1024, 1024}, {256, 3072, 3072}};
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    const std::string case_name = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    const Tensor a = random_matrix(m, k, 1), b = random_matrix(k, n, 2);
    Tensor c = Tensor::empty({m, n}, DType::f32);
    const int runs = flops > 1e11 ? std::max(2, context.repeats / 2) : context.repeats;
    std::map<std::string, double> median;
    const auto report = [&](const std::string& impl, const Timing& t) {
      Result r{"gemm", case_name, impl};
      r.timing = t;
      r.gflops = flops / t.median_s / 1e9;
      r.peak_fraction = r.gflops / context.machine.fma_peak_gflops;
      median[impl] = t.median_s;
      if (median.count("openblas")) r.extra["x_openblas"] = median["openblas"] / t.median_s;
      context.add(r);
    };
    // OpenBLAS first, so the other rows can state their ratio to it.
    openblas_set_num_threads(threads);
    report("openblas", time_runs(
                           [&] {
                             cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                                         static_cast<int>(k), 1.0f, a.data<float>(), static_cast<int>(k), b.data<float>(),
                                         static_cast<int>(n), 0.0f, c.mutable_data<float>(), static_cast<int>(n));
                           },
                           runs));
    openblas_set_num_threads(1);  // back to what cubevec's own OpenBLAS backend expects
    for (auto backend : {ops::GemmBackend::cubevec, ops::GemmBackend::eigen}) {
      report(std::string(ops::gemm_backend_name(backend)) +
                 (backend == ops::GemmBackend::cubevec ? "-" + std::string(ops::gemm::isa_name(ops::gemm::best_isa())) : ""),
             time_runs([&] { ops::matmul(a, b, {.backend = backend}, stream).data_ptr(); }, runs));
    }
    // bf16 inputs, f32 sums: the rate to compare with cubevec's own f32 row.
    const Tensor a16 = to_bf16(a), b16 = to_bf16(b);
    const std::string f32_impl = "cubevec-" + std::string(ops::gemm::isa_name(ops::gemm::best_isa()));
    const Timing t16 = time_runs([&] { ops::matmul(a16, b16, {.compute = DType::bf16}, stream).data_ptr(); }, runs);
    Result r{"gemm", case_name, "cubevec-bf16-" + std::string(ops::gemm::bf16_path_name(ops::gemm::bf16_path()))};
    r.dtype = "bf16";
    r.timing = t16;
    r.gflops = flops / t16.median_s / 1e9;
    r.peak_fraction = r.gflops / context.machine.fma_peak_gflops;
    r.extra["x_openblas"] = median["openblas"] / t16.median_s;
    r.extra["x_cubevec_f32"] = median[f32_impl] / t16.median_s;
    context.add(r);
  }
}

}  // namespace cubevec::bench
