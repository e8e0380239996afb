// The cost model, simulate mode (same shapes and costs as a real run, no arithmetic) and the
// Chrome trace file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "device/cost_model.h"
#include "device_test_util.h"

namespace cubevec {
namespace simulate_trace_test {  // named after the file: unity batches never mix two files' helpers

using namespace testing_ops;

TEST(CostModel, MaxOfComputeAndMemoryPlusLaunchOverhead) {
  DeviceProfile p = builtin_cpu_profile();
  p.cube_tflops = {{DType::bf16, 100.0}};
  p.vector_tflops = {{DType::f32, 10.0}};
  p.hbm_gbps = 1000.0;
  p.launch_overhead_us = 5.0;
  const ModelledCost gemm = model_kernel(p, {"gemm", Unit::cube, 2e12, 1e9, DType::bf16});
  EXPECT_DOUBLE_EQ(gemm.compute_s, 0.02);  // 2e12 / 1e14
  EXPECT_DOUBLE_EQ(gemm.memory_s, 0.001);  // 1e9 / 1e12
  EXPECT_DOUBLE_EQ(gemm.total_s, 0.02 + 5e-6);
  const ModelledCost norm = model_kernel(p, {"norm", Unit::vector, 1e9, 4e9, DType::f32});
  EXPECT_DOUBLE_EQ(norm.total_s, 0.004 + 5e-6);  // memory-bound
  try {
    model_kernel(p, {"gemm", Unit::cube, 1, 1, DType::f32});
    FAIL() << "no f32 cube figure in this profile";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no cube_tflops figure for f32"), std::string::npos) << e.what();
  }
}

// A profile with the "kernels" figures: 4 AI cores with 16 x 32 output tiles.
DeviceProfile kernel_model_profile() {
  DeviceProfile p = builtin_cpu_profile();
  p.ai_cores = 4;
  p.cube_tflops = {{DType::bf16, 100.0}};
  p.vector_tflops = {{DType::bf16, 10.0}};
  p.hbm_gbps = 1e6;  // compute-bound everywhere below
  p.launch_overhead_us = 0;
  p.has_kernel_model = true;
  p.cube_efficiency = 0.5;
  p.attention_efficiency = 0.25;
  p.vector_efficiency = 0.8;
  p.cube_tile_m = 16;
  p.cube_tile_n = 32;
  p.attention_vector_ops = 5;
  return p;
}

TEST(CostModel, TileEfficiencyCountsPaddedTilesAndTheLastWave) {
  const DeviceProfile p = kernel_model_profile();
  // 64 x 128: 4 x 4 = 16 whole tiles, 4 full waves of 4 cores.
  EXPECT_DOUBLE_EQ(tile_efficiency(p, {1, 64, 128}), 1.0);
  // 17 x 32: 2 tiles (the second holds 1 row of 16) in one wave of 4 cores: 17 x 32 / (4 x 16 x 32).
  EXPECT_DOUBLE_EQ(tile_efficiency(p, {1, 17, 32}), 17.0 * 32 / (4 * 16 * 32));
  // 3 batches of 16 x 64: 6 whole tiles, 2 waves (the second half idle): 6 / 8.
  EXPECT_DOUBLE_EQ(tile_efficiency(p, {3, 16, 64}), 6.0 / 8);
  // Rows only (attention's query blocks): 5 heads x 40 rows = 5 x 3 blocks of 16 in 4 waves.
  EXPECT_DOUBLE_EQ(tile_efficiency(p, {5, 40, 0}), 5.0 * 40 / (4 * 4 * 16));
  EXPECT_DOUBLE_EQ(tile_efficiency(p, {0, 0, 0}), 1.0) << "unknown work is not quantized";
  EXPECT_DOUBLE_EQ(tile_efficiency(builtin_cpu_profile(), {1, 17, 32}), 1.0) << "no tile figures";
}

TEST(CostModel, KernelClassesGetTheirEfficiencyAndAttentionTheLongerOfItsTwoUnits) {
  const DeviceProfile p = kernel_model_profile();
  KernelDesc gemm{"gemm", Unit::cube, 1e12, 0, DType::bf16};
  gemm.cube_work = {1, 17, 32};
  const double tiles = 17.0 * 32 / (4 * 16 * 32);
  EXPECT_DOUBLE_EQ(model_kernel(p, gemm).compute_s, 1e12 / (100e12 * 0.5 * tiles));
  KernelDesc attention{"attention", Unit::cube, 1e12, 0, DType::bf16};
  attention.cube_work = {4, 64, 0};  // 16 whole query blocks: no tile loss
  attention.scores = 1e9;            // softmax: 5e9 Vector ops / (10 TFLOP/s x 0.8) = 0.625 ms
  EXPECT_DOUBLE_EQ(model_kernel(p, attention).compute_s, 1e12 / (100e12 * 0.25));  // 40 ms on the Cube: the longer
  attention.scores = 1e12;                                                         // now the softmax (625 ms) is the longer
  EXPECT_DOUBLE_EQ(model_kernel(p, attention).compute_s, 5e12 / (10e12 * 0.8));
  const KernelDesc norm{"norm", Unit::vector, 1e9, 0, DType::bf16};
  EXPECT_DOUBLE_EQ(model_kernel(p, norm).compute_s, 1e9 / (10e12 * 0.8));
}

// With "attention_keys", attention's efficiency follows S / (S + half_rate) relative to the
// reference length, clamped to the measured range; GEMMs and unknown lengths keep their figure.
TEST(CostModel, AttentionEfficiencyFollowsItsKeyLength) {
  DeviceProfile p = kernel_model_profile();
  p.attention_keys = {4000, 1000, 2000, 64000};  // reference, half_rate, shortest, longest
  KernelDesc attention{"attention", Unit::cube, 1e12, 0, DType::bf16};
  attention.cube_work = {4, 64, 0};
  attention.scores = 1;  // the Cube side is the longer
  const auto seconds_at = [&](int64_t keys) {
    attention.key_length = keys;
    return model_kernel(p, attention).compute_s;
  };
  const double at_reference = 1e12 / (100e12 * 0.25);
  EXPECT_DOUBLE_EQ(seconds_at(4000), at_reference);
  EXPECT_DOUBLE_EQ(seconds_at(0), at_reference) << "unknown length: the reference efficiency";
  // 16,000 keys: (16000 / 17000) / (4000 / 5000) = 1.1765 x the reference efficiency.
  EXPECT_DOUBLE_EQ(seconds_at(16000), 1e12 / (100e12 * 0.25 * (16000.0 / 17000) / (4000.0 / 5000)));
  EXPECT_DOUBLE_EQ(seconds_at(500), seconds_at(2000)) << "below the measured range: clamped to its shortest";
  EXPECT_DOUBLE_EQ(seconds_at(1000000), seconds_at(64000)) << "above it: clamped to its longest";
  EXPECT_GT(seconds_at(2000), at_reference);
  p.attention_efficiency = 0.9;  // never above the peak, whatever the curve says
  EXPECT_DOUBLE_EQ(seconds_at(64000), 1e12 / 100e12);
  KernelDesc gemm{"gemm", Unit::cube, 1e12, 0, DType::bf16};
  gemm.key_length = 64000;  // ignored: not attention
  EXPECT_DOUBLE_EQ(model_kernel(p, gemm).compute_s, 1e12 / (100e12 * 0.5));
}

TEST(CostModel, HostIssueClockHoldsBackKernelsShorterThanTheirIssue) {
  DeviceProfile p = kernel_model_profile();
  p.host_issue_us = 100;
  Device device(p, {.simulate = true});
  Stream s = device.new_stream("s");
  // Ten tiny kernels (0.1 us each): the host issues one every 100 us, so the last starts at 1 ms.
  Tensor x = Tensor::meta({4}, DType::bf16);
  for (int i = 0; i < 10; ++i) s.launch({"tiny", Unit::vector, 1e6, 0, DType::bf16}, {x}, {x}, [] {});
  device.synchronize();
  EXPECT_NEAR(s.modelled_time_s(), 10 * 100e-6 + 1e6 / (10e12 * 0.8), 1e-12);
  p.host_issue_us = 0;
  Device eager(p, {.simulate = true});
  Stream t = eager.new_stream("t");
  Tensor y = Tensor::meta({4}, DType::bf16);  // x remembers the other device's last write
  for (int i = 0; i < 10; ++i) t.launch({"tiny", Unit::vector, 1e6, 0, DType::bf16}, {y}, {y}, [] {});
  eager.synchronize();
  EXPECT_NEAR(t.modelled_time_s(), 10 * 1e6 / (10e12 * 0.8), 1e-12);
}

TEST(CostModel, KernelsOverlappingOnTheTwoUnitsShareTheHbm) {
  for (const bool kernel_model : {true, false}) {
    DeviceProfile p = kernel_model_profile();
    p.has_kernel_model = kernel_model;
    p.hbm_gbps = 1000;  // 1 GB: 1 ms alone
    Device device(p, {.simulate = true});
    Stream cube = device.new_stream("cube"), vector = device.new_stream("vector");
    const Tensor x = Tensor::meta({4}, DType::bf16), y = Tensor::meta({4}, DType::bf16);
    cube.launch({"copy", Unit::cube, 0, 1e9, DType::bf16}, {x}, {x}, [] {});
    vector.launch({"copy", Unit::vector, 0, 1e9, DType::bf16}, {y}, {y}, [] {});  // starts while the Cube copy runs
    device.synchronize();
    EXPECT_NEAR(cube.modelled_time_s(), 1e-3, 1e-12);
    EXPECT_NEAR(vector.modelled_time_s(), kernel_model ? 2e-3 : 1e-3, 1e-12) << "half the bandwidth while both run";
  }
}

// A small two-stream workload; returns the trace records after it ran.
std::vector<KernelRecord> run_workload(bool simulate, Shape& out_shape) {
  Device device(two_thread_profile(), {.simulate = simulate, .trace = true});
  Stream cube = device.new_stream("cube"), vec = device.new_stream("vector");
  const Tensor a = fill(vec, {64, 32}, 0.5f);
  const Tensor b = fill(vec, {32, 48}, 2.0f);
  const Tensor c = matmul(cube, a, b);  // waits for both fills (implicit dependency)
  const Tensor d = add(vec, c, c);
  out_shape = d.shape();
  EXPECT_EQ(d.has_storage(), !simulate);
  device.synchronize();
  if (!simulate) {
    EXPECT_EQ(d.at<float>({63, 47}), 64.0f);  // 2 * (32 * 0.5 * 2)
  }
  return device.trace().records();
}

TEST(Simulate, SameShapesAndCostsAsARealRun) {
  Shape real_shape, simulated_shape;
  const auto real = run_workload(false, real_shape);
  const auto simulated = run_workload(true, simulated_shape);
  EXPECT_EQ(real_shape, simulated_shape);
  ASSERT_EQ(real.size(), simulated.size());
  for (std::size_t i = 0; i < real.size(); ++i) {
    EXPECT_EQ(real[i].desc.name, simulated[i].desc.name);
    EXPECT_EQ(real[i].desc.unit, simulated[i].desc.unit);
    EXPECT_EQ(real[i].desc.flops, simulated[i].desc.flops);
    EXPECT_EQ(real[i].desc.bytes, simulated[i].desc.bytes);
    EXPECT_DOUBLE_EQ(real[i].modelled_start_s, simulated[i].modelled_start_s);
    EXPECT_DOUBLE_EQ(real[i].modelled_end_s, simulated[i].modelled_end_s);
    EXPECT_TRUE(real[i].ran);
    EXPECT_FALSE(simulated[i].ran) << "simulate mode must not run kernel bodies";
  }
  // The matmul waited for the fills on the other stream on the modelled timeline too.
  EXPECT_GE(real[2].modelled_start_s, real[1].modelled_end_s);
}

TEST(Simulate, ModelledTimelineOverlapsUnitsAcrossStreams) {
  DeviceProfile p = two_thread_profile();
  p.launch_overhead_us = 0;
  Device device(p, {.simulate = true});
  Stream cube = device.new_stream(), vec = device.new_stream();
  for (int i = 0; i < 10; ++i) {
    cube.launch({"gemm", Unit::cube, 1e9, 0, DType::f32}, {}, {}, [] {});
    vec.launch({"norm", Unit::vector, 0, 1e8, DType::f32}, {}, {}, [] {});
  }
  device.synchronize();
  const DeviceStats s = device.stats();
  const double cube_s = 10 * 1e9 / (p.cube_tflops.at(DType::f32) * 1e12);
  const double vec_s = 10 * 1e8 / (p.hbm_gbps * 1e9);
  EXPECT_NEAR(s.modelled_busy_s[0], cube_s, 1e-12);
  EXPECT_NEAR(s.modelled_busy_s[1], vec_s, 1e-12);
  EXPECT_NEAR(s.modelled_makespan_s, std::max(cube_s, vec_s), 1e-12) << "independent streams overlap";

  // The same work on one stream is serialized.
  device.reset_timeline();
  Stream one = device.new_stream();
  for (int i = 0; i < 10; ++i) {
    one.launch({"gemm", Unit::cube, 1e9, 0, DType::f32}, {}, {}, [] {});
    one.launch({"norm", Unit::vector, 0, 1e8, DType::f32}, {}, {}, [] {});
  }
  device.synchronize();
  EXPECT_NEAR(device.stats().modelled_makespan_s, cube_s + vec_s, 1e-12);
}

TEST(Trace, WritesChromeTraceJson) {
  Device device(two_thread_profile(), {.trace = true});
  Stream s = device.new_stream("main");
  const Tensor a = fill(s, {8, 8}, 1.0f);
  const Tensor c = matmul(s, a, a);
  device.synchronize();
  const std::string path = (std::filesystem::temp_directory_path() / "cubevec_trace_test.json").string();
  device.trace().write_chrome_json(path, "test-device");
  std::ifstream in(path);
  const auto json = nlohmann::json::parse(in);
  int measured = 0, modelled = 0;
  std::set<std::string> processes;
  for (const auto& e : json["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") processes.insert(e["args"]["name"].get<std::string>());
    if (e["ph"] != "X") continue;
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    (e["pid"].get<int>() <= 2 ? measured : modelled) += 1;
    if (e["name"] == "matmul") {
      EXPECT_EQ(e["args"]["flops"].get<double>(), 2.0 * 8 * 8 * 8);
    }
  }
  EXPECT_EQ(measured, 4) << "two kernels, each on a unit track and a stream track";
  EXPECT_EQ(modelled, 4);
  EXPECT_EQ(processes.size(), 4u);
  std::filesystem::remove(path);
  EXPECT_THROW(device.trace().write_chrome_json("/nonexistent/dir/trace.json", "x"), Error);
}

}  // namespace simulate_trace_test
}  // namespace cubevec
