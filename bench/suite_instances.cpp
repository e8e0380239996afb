// Suite `instances`: N instances of a small MLP sharing one copy of the weights, served
// concurrently (each on its own streams) against one after another, on the same device.
#include <random>

#include "bench/harness.h"
#include "pipelines/multi_instance.h"

namespace cubevec::bench {

void instances_suite(Context& context) {
  const int layers = 8;
  const int64_t width = 512, tokens = 256;
  Device device(builtin_cpu_profile());
  const MlpWeights model = make_mlp_weights(layers, width, 7);
  const double flops_per_instance = 2.0 * layers * static_cast<double>(tokens * width * width);
  for (int instances : {2, 4}) {
    std::vector<Tensor> inputs;
    std::mt19937 rng(instances);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (int i = 0; i < instances; ++i) {
      std::vector<float> v(static_cast<std::size_t>(tokens * width));
      for (float& x : v) x = dist(rng);
      inputs.push_back(Tensor::from_vector(v, {tokens, width}));
    }
    double sequential_median = 0;
    for (bool concurrent : {false, true}) {
      std::vector<double> walls;
      run_instances(device, model, inputs, concurrent);  // warm-up
      for (int r = 0; r < context.repeats; ++r) walls.push_back(run_instances(device, model, inputs, concurrent).wall_s);
      Result row{"instances",
                 std::to_string(instances) + "x mlp" + std::to_string(layers) + " " + std::to_string(tokens) + "x" + std::to_string(width),
                 concurrent ? "concurrent" : "one-after-another"};
      row.timing = summarize(walls);
      row.gflops = flops_per_instance * instances / row.timing.median_s / 1e9;
      row.peak_fraction = row.gflops / context.machine.fma_peak_gflops;
      row.extra["requests_per_s"] = instances / row.timing.median_s;
      if (!concurrent) sequential_median = row.timing.median_s;
      row.extra["throughput_gain"] = sequential_median / row.timing.median_s;
      context.add(row);
    }
  }
}

}  // namespace cubevec::bench
