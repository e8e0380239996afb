// Enqueues GEMMs (f32, then many small int8 ones) on the default device and returns from main()
// without waiting for them: the device is leaked on purpose, so its unit threads go on running
// them while static objects are destroyed. Run by KernelsAtExit.TheGlobalsTheyUseOutliveMain: under ASan, a global a
// kernel uses (the GEMM tuner, the CPU's cache sizes) destroyed at exit is a heap-use-after-free.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ops/gemm.h"
#include "ops/gemm/int8.h"
#include "ops/quantized.h"
#include "tensor/tensor.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s EMPTY_CACHE_DIR\n", argv[0]);
    return 2;
  }
  // A tuning file of its own: the first GEMM of each kind calibrates (milliseconds, past main()).
  setenv("XDG_CACHE_HOME", argv[1], 1);
  using cubevec::Tensor;
  const int64_t m = 300, n = 256, k = 512;
  std::vector<float> x(static_cast<std::size_t>(m * k)), w(static_cast<std::size_t>(n * k));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7) - 3.0f;
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 5) - 2.0f;
  const Tensor xt = Tensor::from_vector(x, {m, k}), wt = Tensor::from_vector(w, {n, k});
  std::vector<int8_t> w8(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) w8[i] = static_cast<int8_t>(w[i]);
  const auto packed = cubevec::ops::gemm::pack_int8_weight(w8.data(), n, k, k, cubevec::ops::gemm::best_int8_isa());
  cubevec::ops::matmul(xt, wt, {.b_is_weight = true});
  // Many small int8 GEMMs (each asks the tuner for its A block) keep the unit busy past main().
  const Tensor row = Tensor::from_vector(std::vector<float>(x.begin(), x.begin() + k), {1, k});
  for (int i = 0; i < 2000; ++i) cubevec::ops::matmul_int8_quantizing(row, {}, packed);
  std::printf("enqueued\n");
  return 0;
}
