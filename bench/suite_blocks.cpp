// Suite `blocks`: one Flux double block and one single block at FLUX.1 width (3072 hidden, 24
// heads x 128) on 1024 image + 256 text tokens, f32 and bf16 weights, each with its per-op
// breakdown (measured kernel time by kernel name), and the same two blocks in PyTorch 1.13 on CPU
// measured in the same run by bench/torch_flux_blocks.py (Debian's /usr/bin/python3; skipped with a
// note when torch is not installed). GFLOP/s count every kernel's declared FLOPs; the fraction is
// of the measured 2-thread FMA peak.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench/harness.h"
#include "models/flux_transformer.h"
#include "ops/vector_ops.h"

namespace cubevec::bench {

namespace {

constexpr int64_t kImg = 1024, kTxt = 256;

// bench/torch_flux_blocks.py's JSON, or null when it cannot run.
nlohmann::json run_torch(int threads, int repeats) {
  const std::string script = std::string(CUBEVEC_SOURCE_DIR) + "/bench/torch_flux_blocks.py";
  const std::string command = "/usr/bin/python3 " + script + " --threads " + std::to_string(threads) + " --repeats " +
                              std::to_string(repeats) + " 2>/dev/null";
  std::fprintf(stderr, "running the PyTorch baseline: %s\n", command.c_str());
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return nullptr;
  std::string out;
  char buffer[4096];
  while (std::size_t n = fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  if (pclose(pipe) != 0 || out.empty()) return nullptr;
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception&) {
    return nullptr;
  }
}

struct BlockRun {
  Timing timing;
  double flops = 0;
  std::map<std::string, double> op_s;  // measured kernel seconds by kernel name, one run
};

}  // namespace

void blocks_suite(Context& context) {
  const int threads = context.machine.threads;
  const nlohmann::json torch = run_torch(threads, std::max(2, context.repeats / 2));
  if (torch.is_null()) std::fprintf(stderr, "note: the PyTorch baseline did not run (needs Debian's python3-torch)\n");

  DeviceProfile profile = builtin_cpu_profile();
  profile.cube_threads = threads;
  profile.vector_threads = threads;
  Device device(profile, {.trace = true});
  const Stream s = device.default_stream();
  const models::FluxConfig config = models::FluxConfig::flux1_dev();
  const int64_t d = config.inner_dim();

  // Inputs: random activations, zero text ids and the 32 x 32 image grid.
  models::ParameterTable inputs_table;
  Tensor hidden, context_states, temb;
  inputs_table.add("hidden", {1, kImg, d}, &hidden);
  inputs_table.add("context", {1, kTxt, d}, &context_states);
  inputs_table.add("temb", {1, d}, &temb);
  models::make_random_parameters(inputs_table, DType::f32, 11, 1.0f);
  const Tensor silu = ops::activation(temb, ops::Activation::silu, s);
  const models::RopeTable txt = models::flux_rope(Tensor::zeros({kTxt, 3}, DType::f32), config.axes_dims_rope);
  const models::RopeTable img = models::flux_rope(models::flux_image_ids(64, 64), config.axes_dims_rope);
  const models::RopeTable rope{ops::concat({txt.cos, img.cos}, 0, s), ops::concat({txt.sin, img.sin}, 0, s)};

  for (DType dtype : {DType::f32, DType::bf16}) {
    const std::string dt(dtype_name(dtype));
    models::ParameterTable table;
    models::FluxDoubleBlock double_block;
    models::FluxSingleBlock single_block;
    double_block.declare(table, "double.", config);
    single_block.declare(table, "single.", config);
    models::make_random_parameters(table, dtype, 5, 0.02f);
    const Tensor joint = ops::concat({context_states, hidden}, 1, s);

    auto measure = [&](const std::function<Tensor()>& forward) {
      BlockRun run;
      const int runs = std::max(2, context.repeats / 2);
      run.timing = time_runs([&] { forward().data_ptr(); }, runs);
      // One more, traced, for the breakdown and the FLOP count.
      device.synchronize();
      device.trace().clear();
      forward().data_ptr();
      device.synchronize();
      for (const auto& r : device.trace().records()) {
        run.flops += r.desc.flops;
        run.op_s[r.desc.name] += r.real_end_s - r.real_start_s;
      }
      return run;
    };
    const BlockRun runs[2] = {
        measure([&] { return double_block.forward(hidden, context_states, silu, rope, s).first; }),
        measure([&] { return single_block.forward(joint, silu, rope, s); })};
    const char* names[2] = {"double", "single"};
    for (int b = 0; b < 2; ++b) {
      const BlockRun& run = runs[b];
      Result r{"blocks", std::string("flux ") + names[b] + " 1024+256 x3072", "cubevec"};
      r.dtype = dt;
      r.timing = run.timing;
      r.gflops = run.flops / run.timing.median_s / 1e9;
      r.peak_fraction = r.gflops / context.machine.fma_peak_gflops;
      if (!torch.is_null())
        for (const auto& t : torch["results"])
          if (t["block"] == names[b] && t["dtype"] == dt) r.extra["x_torch"] = t["median_s"].get<double>() / run.timing.median_s;
      context.add(r);
      // The per-op breakdown: measured kernel time, largest first.
      std::vector<std::pair<double, std::string>> ops;
      double total = 0;
      for (const auto& [name, sec] : run.op_s) {
        ops.push_back({sec, name});
        total += sec;
      }
      std::sort(ops.rbegin(), ops.rend());
      for (const auto& [sec, name] : ops) {
        Result op{"blocks", std::string("  ") + names[b] + " op", name};
        op.dtype = dt;
        op.timing = summarize({sec});
        op.extra["share"] = sec / total;
        context.add(op);
      }
    }
    if (!torch.is_null()) {
      for (const auto& t : torch["results"]) {
        if (t["dtype"] != dt) continue;
        Result r{"blocks", "flux " + t["block"].get<std::string>() + " 1024+256 x3072", "pytorch-" + torch["torch_version"].get<std::string>()};
        r.dtype = dt;
        r.timing = summarize(t["runs_s"].get<std::vector<double>>());
        context.add(r);
      }
    }
  }
}

}  // namespace cubevec::bench
