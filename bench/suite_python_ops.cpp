// Suite `python-ops`: the C++ side of bench/python_overhead.py. The same operator calls the Python
// module's layer functions make (python/layers.cpp), on the same device (the process's default
// device, ops' default stream), each followed by the same wait for its result: what is left when
// Python's figure is compared with these is the binding's own cost (argument checks, wrapping the
// arrays, the result array, the GIL). Rows:
//   small ops    a call's time in microseconds (median over runs of 200 calls each)
//   attention    attention_forward at S=4608, 24 heads x 128, f32 BSND, opt_mode runtime (the
//                Python default), GFLOP/s and the fraction of the FMA peak
#include <random>

#include "bench/harness.h"
#include "device/device.h"
#include "ops/attention.h"
#include "ops/vector_ops.h"

namespace cubevec::bench {

namespace {

Tensor random_tensor(const Shape& shape, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(rng);
  return Tensor::from_vector(v, shape);
}

// One call as the binding makes it: the op, then the device's synchronize and the result's bytes.
template <class Op>
void call_like_python(Op&& op) {
  Tensor out = op();
  default_device().synchronize();
  (void)out.contiguous().data_ptr();
}

}  // namespace

void python_ops_suite(Context& context) {
  constexpr int kCallsPerRun = 200;
  const Tensor x = random_tensor({1, 16, 64}, 1), weight = random_tensor({64}, 2);
  const Tensor scale = random_tensor({1, 64}, 3), shift = random_tensor({1, 64}, 4);
  const Tensor rope_x = random_tensor({1, 16, 2, 64}, 5), cos = random_tensor({16, 64}, 6), sin = random_tensor({16, 64}, 7);
  const Tensor q = random_tensor({1, 16, 2, 32}, 8), k = random_tensor({1, 16, 2, 32}, 9), v = random_tensor({1, 16, 2, 32}, 10);
  struct Small {
    const char* name;
    std::function<Tensor()> op;
  };
  const std::vector<Small> small = {
      {"rms_norm [1,16,64]", [&] { return ops::rms_norm(x, weight, 1e-6f); }},
      {"gelu-tanh [1,16,64]", [&] { return ops::activation(x, ops::Activation::gelu_tanh); }},
      {"rope [1,16,2,64]", [&] { return ops::rotary_position_embedding(rope_x, cos, sin); }},
      {"layernorm_scale_shift [1,16,64]", [&] { return ops::layernorm_scale_shift(x, scale, shift); }},
      {"attention [1,16,2,32]", [&] { return ops::attention_forward(q, k, v); }},
  };
  for (const Small& s : small) {
    call_like_python(s.op);  // the runtime tuner's first call for the shape
    const Timing t = time_runs(
        [&] {
          for (int i = 0; i < kCallsPerRun; ++i) call_like_python(s.op);
        },
        std::max(7, context.repeats), 1);
    Result r{"python-ops", s.name, "c++"};
    r.timing = {t.median_s / kCallsPerRun, t.min_s / kCallsPerRun, t.max_s / kCallsPerRun, t.runs};
    r.extra["us_per_call"] = t.median_s / kCallsPerRun * 1e6;
    context.add(r);
  }

  const int64_t s = 4608, n = 24, d = 128;
  const Tensor big_q = random_tensor({1, s, n, d}, 11), big_k = random_tensor({1, s, n, d}, 12), big_v = random_tensor({1, s, n, d}, 13);
  call_like_python([&] { return ops::attention_forward(big_q, big_k, big_v); });  // tunes the shape once
  const Timing t = time_runs([&] { call_like_python([&] { return ops::attention_forward(big_q, big_k, big_v); }); },
                             std::max(3, context.repeats / 2), 0);
  Result r{"python-ops", "attention S4608 24x128", "c++"};
  r.timing = t;
  r.gflops = 4.0 * static_cast<double>(n * s) * static_cast<double>(s * d) / t.median_s / 1e9;
  r.peak_fraction = r.gflops / context.machine.fma_peak_gflops;
  context.add(r);
}

}  // namespace cubevec::bench
