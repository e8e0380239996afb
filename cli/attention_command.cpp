// `cubevec attention`: one attention_forward shape on random inputs, as the runtime autotuner (or
// a static / manual choice) runs it: the implementation used, the time of the first call (which
// tunes) and the median of the later ones, GFLOP/s. With --attn-tune-cache the picks persist.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/output_flag.h"
#include "ops/attention.h"
#include "ops/attention_tuner.h"
#include "cli/attention_tune_cache.h"
#include "cli/command.h"
#include "cli/device_flags.h"
#include "cli/range_flag.h"
#include "tensor/half.h"
#include "base/output_file.h"
#include "base/json_text.h"

namespace cubevec::cli {

namespace {

struct AttentionFlags {
  int64_t batch = 1, heads = 24, head_dim = 128, q_len = 1024, kv_len = 0;
  std::string dtype = "f32", layout = "BSND", opt_mode = "runtime", op_type = "flash", kernel_layout = "BNSD";
  int repeats = 3;
  std::string json_path;
};

Tensor random_input(const Shape& shape, DType dtype, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Tensor t = Tensor::empty(shape, dtype);
  const auto n = static_cast<std::size_t>(t.numel());
  if (dtype == DType::f32) {
    float* p = t.mutable_data<float>();
    for (std::size_t i = 0; i < n; ++i) p[i] = dist(rng);
  } else {
    uint16_t* p = t.mutable_data<uint16_t>();
    for (std::size_t i = 0; i < n; ++i) p[i] = f32_to_bf16(dist(rng));
  }
  return t;
}

// A flag's value through its parser, whose error then names the flag (--layout and
// --kernel-layout share one parser).
template <class Parse>
auto parsed_flag(const char* flag, const std::string& value, Parse parse) {
  try {
    return parse(value);
  } catch (const Error& e) {
    throw Error(std::string(flag) + ": " + e.what());
  }
}

int run(const AttentionFlags& f, const DeviceFlags& device_flags, const AttentionTuneCacheFlag& cache) {
  // Checked before parse_dtype, whose message would list every dtype name it knows.
  if (f.dtype != "f32" && f.dtype != "bf16") throw Error("--dtype must be f32 or bf16, got '" + f.dtype + "'");
  const DType dtype = parse_dtype(f.dtype);
  ops::AttentionOptions options;
  const auto layout = [](const std::string& v) { return ops::parse_attention_layout(v); };
  options.layout = parsed_flag("--layout", f.layout, layout);
  options.opt_mode = parsed_flag("--opt-mode", f.opt_mode, [](const std::string& v) { return ops::parse_attention_opt_mode(v); });
  options.op_type = parsed_flag("--op-type", f.op_type, [](const std::string& v) { return ops::parse_attention_impl(v); });
  options.kernel_layout = parsed_flag("--kernel-layout", f.kernel_layout, layout);
  options.num_heads = f.heads;
  const int64_t kv_len = f.kv_len > 0 ? f.kv_len : f.q_len;
  auto shape_of = [&](int64_t s) -> Shape {
    switch (options.layout) {
      case ops::AttentionLayout::bnsd: return {f.batch, f.heads, s, f.head_dim};
      case ops::AttentionLayout::bsh: return {f.batch, s, f.heads * f.head_dim};
      default: return {f.batch, s, f.heads, f.head_dim};
    }
  };
  Device device(device_flags.resolve());
  cache.load(device);
  const Stream stream = device.default_stream();
  const Tensor q = random_input(shape_of(f.q_len), dtype, 1), k = random_input(shape_of(kv_len), dtype, 2),
               v = random_input(shape_of(kv_len), dtype, 3);
  const ops::AttentionTuneKey key{f.batch, f.heads, f.head_dim, f.q_len, kv_len, dtype, options.layout, ops::AttentionMaskKind::none};
  const bool cached = ops::AttentionTuner::global().find(key).has_value();
  std::fprintf(stderr, "attention %s, opt_mode %s, profile %s: %d Cube thread(s), %d Vector thread(s)\n", key.text().c_str(),
               f.opt_mode.c_str(), device.profile().name.c_str(), device.profile().cube_threads, device.profile().vector_threads);

  auto timed_call = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    ops::attention_forward(q, k, v, options, stream).data_ptr();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double first_s = timed_call();
  std::vector<double> times;
  for (int i = 0; i < f.repeats; ++i) times.push_back(timed_call());
  std::sort(times.begin(), times.end());
  const double median_s = times[times.size() / 2];
  const double flops = 4.0 * static_cast<double>(f.batch * f.heads) * static_cast<double>(f.q_len) * static_cast<double>(kv_len) *
                       static_cast<double>(f.head_dim);

  std::string impl =
      std::string(ops::attention_impl_name(options.op_type)) + "/" + std::string(ops::attention_layout_name(options.kernel_layout));
  if (options.opt_mode == ops::AttentionOptMode::static_table)
    impl = std::string(ops::attention_impl_name(ops::attention_static_impl(dtype))) + "/" +
           std::string(ops::attention_layout_name(options.layout == ops::AttentionLayout::bnsd ? ops::AttentionLayout::bnsd
                                                                                               : ops::AttentionLayout::bsnd));
  if (options.opt_mode == ops::AttentionOptMode::runtime) {
    const auto pick = ops::AttentionTuner::global().find(key);
    impl = std::string(ops::attention_impl_name(pick->op_type)) + "/" + std::string(ops::attention_layout_name(pick->kernel_layout));
    std::fprintf(stderr, "%s: %s\n", cached ? "tune cache hit" : "tuned on the first call", impl.c_str());
  }
  std::printf("implementation  %s\nfirst call      %.3f ms%s\nmedian          %.3f ms over %d calls\nrate            %.1f GFLOP/s\n",
              impl.c_str(), first_s * 1e3, (options.opt_mode == ops::AttentionOptMode::runtime && !cached) ? " (includes tuning)" : "",
              median_s * 1e3, f.repeats, flops / median_s / 1e9);
  cache.save(device);
  if (!f.json_path.empty()) {
    const nlohmann::ordered_json json = {{"key", key.text()},
                                         {"opt_mode", f.opt_mode},
                                         {"implementation", impl},
                                         {"tune_cache_hit", options.opt_mode == ops::AttentionOptMode::runtime && cached},
                                         {"first_call_s", first_s},
                                         {"median_s", median_s},
                                         {"gflops", flops / median_s / 1e9}};
    write_output_file(f.json_path, "--json", dump_json(json, 2) + "\n");
  }
  return 0;
}

}  // namespace

CommandRunner add_attention_command(CLI::App& app) {
  auto* command = app.add_subcommand("attention", "Time attention_forward on one shape (random inputs) and show the autotuner's pick");
  auto flags = std::make_shared<AttentionFlags>();
  auto device_flags = add_device_flags(*command);
  auto cache = add_attention_tune_cache_flag(*command);
  command->add_option("--batch", flags->batch, "B")->check(in_range(int64_t{1}, int64_t{1} << 20));
  command->add_option("--heads", flags->heads, "N")->check(in_range(int64_t{1}, int64_t{1} << 20));
  command->add_option("--head-dim", flags->head_dim, "D")->check(in_range(int64_t{1}, int64_t{1} << 16));
  command->add_option("--q-len", flags->q_len, "Sq")->check(in_range(int64_t{1}, int64_t{1} << 24));
  command->add_option("--kv-len", flags->kv_len, "Sk (default: Sq)")->check(in_range(int64_t{1}, int64_t{1} << 24));
  command->add_option("--dtype", flags->dtype, "f32 or bf16");
  command->add_option("--layout", flags->layout, "BSND, BNSD or BSH");
  command->add_option("--opt-mode", flags->opt_mode, "runtime, static or manual");
  command->add_option("--op-type", flags->op_type,
                      "manual mode: math, flash, cv_pipelined, flash_bf16 (AMX-BF16 tiles or AVX512-BF16) or flash_int8 (int8 Q K^T on "
                      "AMX-INT8 or AVX512-VNNI: lossy)");
  command->add_option("--kernel-layout", flags->kernel_layout, "manual mode: BSND or BNSD");
  command->add_option("--repeats", flags->repeats, "Timed calls after the first")->check(in_range(1, 1000));
  command->add_option("--json", flags->json_path, "Write the figures as JSON to this file")->check(output_file_path());
  return [flags, device_flags, cache, command] {
    // The kernel's choice belongs to manual mode: elsewhere the tuner's (or the table's) pick runs.
    for (const char* flag : {"--op-type", "--kernel-layout"})
      if (command->count(flag) && ops::parse_attention_opt_mode(flags->opt_mode) != ops::AttentionOptMode::manual)
        throw Error(std::string(flag) + " applies with --opt-mode manual (got --opt-mode " + flags->opt_mode + ")");
    return run(*flags, *device_flags, *cache);
  };
}

}  // namespace cubevec::cli
