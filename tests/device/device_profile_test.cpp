#include "device/cost_model.h"
#include "device/device_profile.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include <sched.h>

#include "base/error.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace device_profile_test {  // named after the file: unity batches never mix two files' helpers

using testing::message_of;

const std::string kDevices = std::string(CUBEVEC_SOURCE_DIR) + "/assets/devices/";

const char* kValid = R"({"name": "t", "cpu": {"cube_threads": 2, "vector_threads": 3, "pin_units": true},
  "npu": {"ai_cores": 4, "vector_cores": 8, "cube_tflops": {"bf16": 10}, "vector_tflops": {"f32": 1.5},
          "hbm_gbps": 100, "l2_mib": 8, "launch_overhead_us": 3}})";

TEST(DeviceProfile, ShippedProfilesLoad) {
  const DeviceProfile npu = load_device_profile(kDevices + "ascend-910b.json");
  EXPECT_EQ(npu.name, "ascend-910b");
  EXPECT_EQ(npu.ai_cores, 24);
  EXPECT_EQ(npu.vector_cores, 48);
  EXPECT_DOUBLE_EQ(npu.peak_tflops(true, DType::bf16), 313);
  EXPECT_DOUBLE_EQ(npu.hbm_gbps, 1600);
  const DeviceProfile cpu = load_device_profile(kDevices + "cpu-default.json");
  EXPECT_EQ(cpu.cube_threads + cpu.vector_threads, 2) << "the default suits a 2-core machine";
}

TEST(DeviceProfile, BuiltInMatchesTheShippedCpuDefault) {
  const DeviceProfile file = load_device_profile(kDevices + "cpu-default.json");
  const DeviceProfile builtin = builtin_cpu_profile();
  EXPECT_EQ(file.name, builtin.name);
  // The threads differ on purpose: the file keeps the split its figures were measured with, the
  // built-in profile takes this machine's cores (MachineSizedUnits).
  EXPECT_FALSE(file.machine_sized);
  EXPECT_EQ(file.ai_cores, builtin.ai_cores);
  EXPECT_EQ(file.cube_tflops, builtin.cube_tflops);
  EXPECT_EQ(file.vector_tflops, builtin.vector_tflops);
  EXPECT_EQ(file.hbm_gbps, builtin.hbm_gbps);
  EXPECT_EQ(file.l2_mib, builtin.l2_mib);
  EXPECT_EQ(file.launch_overhead_us, builtin.launch_overhead_us);
  EXPECT_EQ(file.has_links, builtin.has_links);
  EXPECT_EQ(file.peer_gbps, builtin.peer_gbps);
  EXPECT_EQ(file.peer_latency_us, builtin.peer_latency_us);
  EXPECT_EQ(file.host_gbps, builtin.host_gbps);
}

TEST(DeviceProfile, ParsesEveryField) {
  const DeviceProfile p = parse_device_profile(kValid, "valid.json");
  EXPECT_EQ(p.cube_threads, 2);
  EXPECT_EQ(p.vector_threads, 3);
  EXPECT_TRUE(p.pin_units);
  EXPECT_DOUBLE_EQ(p.peak_tflops(false, DType::f32), 1.5);
  EXPECT_DOUBLE_EQ(p.launch_overhead_us, 3);
}

TEST(DeviceProfile, ErrorsNameTheFieldAndWhatWasExpected) {
  const auto with = [](const std::string& from, const std::string& to) {
    std::string text = kValid;
    const auto at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  const auto fails = [&](const std::string& text, const std::string& fragment) {
    const std::string message = message_of([&] { parse_device_profile(text, "p.json"); });
    EXPECT_NE(message.find(fragment), std::string::npos) << "expected '" << fragment << "' in: " << message;
  };
  fails("{", "p.json: not valid JSON");
  fails(with(R"("name": "t", )", ""), "p.json: missing required field \"name\"");
  fails(with(R"("cube_threads": 2)", R"("cube_threads": 0)"), "p.json.cpu.cube_threads: expected an integer from 1 to 4096");
  fails(with(R"("cube_threads": 2)", R"("cube_threads": 2, "cube_thread": 2)"), "p.json.cpu: unknown field \"cube_thread\"");
  fails(with(R"("pin_units": true)", R"("pin_units": 1)"), "p.json.cpu.pin_units: expected true or false");
  fails(with(R"("hbm_gbps": 100)", R"("hbm_gbps": -1)"), "p.json.npu.hbm_gbps: expected a number from 0.001 to 1e+06 GB/s, got -1");
  // Figures outside a plausible range would model inf or 0 seconds: 1e-320 GB/s, 1e308 TFLOP/s.
  fails(with(R"("hbm_gbps": 100)", R"("hbm_gbps": 1e-320)"), "p.json.npu.hbm_gbps: expected a number from 0.001 to 1e+06 GB/s");
  fails(with(R"({"bf16": 10})", R"({"bf16": 1e308})"), "p.json.npu.cube_tflops.bf16: expected a number from 1e-06 to 1e+06 TFLOP/s");
  fails(with(R"("launch_overhead_us": 3)", R"("launch_overhead_us": 1e300)"), "p.json.npu.launch_overhead_us: expected a number from 0");
  fails(with(R"({"bf16": 10})", R"({"float16": 10})"), "unknown dtype 'float16'");
  fails(with(R"({"bf16": 10})", "{}"), "p.json.npu.cube_tflops: expected at least one dtype");
  fails(with(R"("l2_mib": 8)", R"("l2_mib": "big")"), "p.json.npu.l2_mib: expected a number from 0 to 1e+06 MiB");
  EXPECT_NE(message_of([] { load_device_profile("/nonexistent/profile.json"); }).find("cannot open"), std::string::npos);
  // The optional links: checked like every other figure when present.
  const std::string linked = with(R"("launch_overhead_us": 3}})",
                                  R"("launch_overhead_us": 3}, "links": {"peer_gbps": 56, "peer_latency_us": 10, "host_gbps": 50}})");
  const DeviceProfile p = parse_device_profile(linked, "p.json");
  EXPECT_TRUE(p.has_links);
  EXPECT_DOUBLE_EQ(p.peer_gbps, 56);
  EXPECT_FALSE(parse_device_profile(kValid, "p.json").has_links);
  const auto swap = [](std::string text, const std::string& from, const std::string& to) {
    return text.replace(text.find(from), from.size(), to);
  };
  fails(swap(linked, "\"peer_gbps\": 56", "\"peer_gbps\": 0"), "p.json.links.peer_gbps: expected a number from 0.001 to 1e+06 GB/s, got 0");
  fails(swap(linked, "\"host_gbps\": 50", "\"host_gbp\": 50"), "p.json.links: missing required field \"host_gbps\"");
  // The optional kernels figures, likewise.
  const std::string modelled =
      with(R"("launch_overhead_us": 3}})",
           R"("launch_overhead_us": 3}, "kernels": {"cube_efficiency": 0.4, "attention_efficiency": 0.3, )"
           R"("vector_efficiency": 0.7, "cube_tile": [128, 256], "attention_vector_ops": 5, "host_issue_us": 20}})");
  const DeviceProfile k = parse_device_profile(modelled, "p.json");
  EXPECT_TRUE(k.has_kernel_model);
  EXPECT_DOUBLE_EQ(k.attention_efficiency, 0.3);
  EXPECT_EQ(k.cube_tile_n, 256);
  EXPECT_DOUBLE_EQ(k.host_issue_us, 20);
  EXPECT_FALSE(parse_device_profile(kValid, "p.json").has_kernel_model);
  fails(swap(modelled, "\"cube_efficiency\": 0.4", "\"cube_efficiency\": 1.5"),
        "p.json.kernels.cube_efficiency: expected a number from 0.001 to 1 (a fraction of the peak), got 1.5");
  fails(swap(modelled, "[128, 256]", "[128]"),
        "p.json.kernels.cube_tile: expected [rows, columns], two integers from 1 to 4096, got [128]");
  fails(swap(modelled, "[128, 256]", "[0, 256]"), "p.json.kernels.cube_tile: expected [rows, columns]");
  fails(swap(modelled, "\"host_issue_us\": 20", "\"host_issue_us\": -1"), "p.json.kernels.host_issue_us: expected a number from 0");
  fails(swap(modelled, "\"host_issue_us\": 20", "\"host_issue_us\": 20, \"waves\": 1"), "p.json.kernels: unknown field \"waves\"");
  // The optional attention_keys curve: every field required when present, ordered lengths.
  const std::string keyed =
      swap(modelled, "\"host_issue_us\": 20",
           R"("host_issue_us": 20, "attention_keys": {"reference": 4608, "half_rate": 3050, "shortest": 4096, "longest": 131072})");
  const DeviceProfile with_keys = parse_device_profile(keyed, "p.json");
  EXPECT_DOUBLE_EQ(with_keys.attention_keys.half_rate, 3050);
  EXPECT_DOUBLE_EQ(with_keys.attention_efficiency_at(4608), 0.3);
  EXPECT_DOUBLE_EQ(k.attention_efficiency_at(32760), 0.3) << "without the curve: one efficiency";
  fails(swap(keyed, "\"half_rate\": 3050, ", ""), "p.json.kernels.attention_keys: missing required field \"half_rate\"");
  fails(swap(keyed, "\"reference\": 4608", "\"reference\": 200000"),
        "p.json.kernels.attention_keys: expected shortest <= reference <= longest");
  fails(swap(keyed, "\"longest\": 131072", "\"longest\": 131072, \"dim\": 128"), "p.json.kernels.attention_keys: unknown field \"dim\"");
  fails(swap(keyed, "\"half_rate\": 3050", "\"half_rate\": 0"), "p.json.kernels.attention_keys.half_rate: expected a number from 1");
}

TEST(DeviceProfile, CommunicationIsModelledOnlyFromLinkFigures) {
  DeviceProfile p = parse_device_profile(kValid, "nolinks.json");
  const KernelDesc send{"all_gather x", Unit::comm, 0.0, 1e9, DType::f32};
  EXPECT_NE(message_of([&] {
              model_kernel(p, send);
            }).find("device profile 't' (nolinks.json) has no \"links\" figures, needed to model 'all_gather x'"),
            std::string::npos);
  p.has_links = true;
  p.peer_gbps = 50;
  p.peer_latency_us = 10;
  // 1 GB over a 50 GB/s link: 20 ms, plus the link latency and the launch overhead (3 us).
  EXPECT_NEAR(model_kernel(p, send).total_s, 0.02 + 10e-6 + 3e-6, 1e-12);
}

TEST(DeviceProfile, ThreadOverridesFromEnvironmentThenFlags) {
  DeviceProfile p = builtin_cpu_profile();
  setenv("CUBEVEC_CUBE_THREADS", "3", 1);
  apply_thread_overrides(p);
  EXPECT_EQ(p.cube_threads, 3);
  apply_thread_overrides(p, 5, 2);  // a flag beats the environment
  EXPECT_EQ(p.cube_threads, 5);
  EXPECT_EQ(p.vector_threads, 2);
  setenv("CUBEVEC_CUBE_THREADS", "two", 1);
  EXPECT_NE(message_of([&] { apply_thread_overrides(p); }).find("CUBEVEC_CUBE_THREADS=two: expected an integer"), std::string::npos);
  apply_thread_overrides(p, 4, 0);  // the flag wins: the bad variable is not read
  EXPECT_EQ(p.cube_threads, 4);
  // Digits only: strtol took these (found by a probe).
  for (const char* bad : {" 2", "+2", "2 ", "-2", "0", "4097", "99999999999999999999"}) {
    setenv("CUBEVEC_CUBE_THREADS", bad, 1);
    EXPECT_NE(message_of([&] { apply_thread_overrides(p); }).find("CUBEVEC_CUBE_THREADS=" + std::string(bad) + ": expected an integer"),
              std::string::npos)
        << "'" << bad << "'";
  }
  unsetenv("CUBEVEC_CUBE_THREADS");
}

// Restores the calling thread's affinity mask and the rank-count variables when a test ends.
class AffinityAndRanks {
 public:
  AffinityAndRanks() {
    CPU_ZERO(&saved_);
    sched_getaffinity(0, sizeof saved_, &saved_);
  }
  ~AffinityAndRanks() {
    sched_setaffinity(0, sizeof saved_, &saved_);
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    unsetenv("MPI_LOCALNRANKS");
  }
  int allowed() const { return CPU_COUNT(&saved_); }
  // Narrows the calling thread to the first `count` cores it may use.
  void keep_first(int count) const {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu = 0, kept = 0; cpu < CPU_SETSIZE && kept < count; ++cpu)
      if (CPU_ISSET(cpu, &saved_)) CPU_SET(cpu, &set), ++kept;
    ASSERT_EQ(sched_setaffinity(0, sizeof set, &set), 0);
  }

 private:
  cpu_set_t saved_;
};

TEST(DeviceProfile, MachineSizedUnits) {
  AffinityAndRanks restore;
  const DeviceProfile all = builtin_cpu_profile();
  EXPECT_TRUE(all.machine_sized);
  EXPECT_EQ(all.cube_threads, restore.allowed()) << "every core the process may use";
  EXPECT_EQ(all.vector_threads, restore.allowed());

  restore.keep_first(1);  // as under `taskset -c 0`
  EXPECT_EQ(builtin_cpu_profile().cube_threads, 1);
  EXPECT_EQ(builtin_cpu_profile().vector_threads, 1);
  if (restore.allowed() >= 2) {
    restore.keep_first(2);
    EXPECT_EQ(builtin_cpu_profile().cube_threads, 2);
    // Two ranks of mpirun on this machine share its cores; an unreadable count is taken as 1.
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    EXPECT_EQ(builtin_cpu_profile().cube_threads, 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "many", 1);
    EXPECT_EQ(builtin_cpu_profile().cube_threads, 2);
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    setenv("MPI_LOCALNRANKS", "8", 1);
    EXPECT_EQ(builtin_cpu_profile().vector_threads, 1) << "never below one thread";
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "0", 1);  // unreadable: the next variable counts
    setenv("MPI_LOCALNRANKS", "2", 1);
    EXPECT_EQ(builtin_cpu_profile().cube_threads, 1);
  }
}

TEST(DeviceProfile, InstancesShareOnlyAMachineSizedProfile) {
  DeviceProfile p = builtin_cpu_profile();
  p.cube_threads = 8, p.vector_threads = 3;  // as on a machine with 8 cores (vector: uneven on purpose)
  EXPECT_EQ(profile_for_instance(p, 1).cube_threads, 8);
  EXPECT_EQ(profile_for_instance(p, 2).cube_threads, 4);
  EXPECT_EQ(profile_for_instance(p, 2).vector_threads, 1);
  EXPECT_EQ(profile_for_instance(p, 16).cube_threads, 1) << "never below one thread";

  DeviceProfile asked = p;
  apply_thread_overrides(asked, 8, 3);  // a flag: the user's count, for every instance
  EXPECT_FALSE(asked.machine_sized);
  EXPECT_EQ(profile_for_instance(asked, 2).cube_threads, 8);
  const DeviceProfile file = load_device_profile(kDevices + "cpu-default.json");
  EXPECT_EQ(profile_for_instance(file, 2).cube_threads, file.cube_threads);

  DeviceProfile unchanged = p;
  apply_thread_overrides(unchanged);  // no flag, no environment: still the machine's share
  EXPECT_TRUE(unchanged.machine_sized);
}

}  // namespace device_profile_test
}  // namespace cubevec
