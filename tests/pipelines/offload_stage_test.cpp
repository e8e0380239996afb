// Weight streaming (OffloadStage, issue 19) on the tiny Flux checkpoint: a run with --offload R
// equals the resident run bit for bit (f32 and bf16, twice in a row, so weights let go and packed
// again are intact); the Linears of a block hold packed panels only inside the window; the
// modelled copy stream is priced at the host link; what the
// allocator holds after a run shrinks by the streamed blocks' panels; bad R values; and the
// page release of a memory-mapped tensor (which the OS reads back) against an owned one (which it
// must never touch).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>

#include "models/flux_transformer.h"
#include "models/layers.h"
#include "ops/gemm.h"
#include "pipelines/flux_t2i.h"
#include "pipelines/stages/offload.h"
#include "tensor/caching_allocator.h"
#include "tensor/safetensors.h"

#include "common/temp_dir.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace offload_stage_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

// The largest |a - b| over all elements (both read as doubles).
double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = values(a), y = values(b);
  EXPECT_EQ(x.size(), y.size());
  double worst = 0;
  for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

std::string data_path(const std::string& rel) { return std::string(CUBEVEC_SOURCE_DIR) + "/tests/data/" + rel; }

pipelines::PromptEmbeddings flux_prompt(unsigned seed) {
  return {random_tensor({1, 5, 40}, seed, DType::f32, 1.0f), random_tensor({1, 24}, seed + 1, DType::f32, 1.0f)};
}

pipelines::T2IOptions small_run(DType activations) {
  pipelines::T2IOptions o;
  o.width = 24, o.height = 16;
  o.steps = 2;
  o.activations = activations;
  return o;
}

Tensor denoise(pipelines::FluxT2IPipeline& pipeline, pipelines::StageList* stages, DType activations) {
  Device device(builtin_cpu_profile());
  pipelines::T2ITimings timings;
  const auto prompt = flux_prompt(1);
  return pipeline.denoise(prompt, nullptr, small_run(activations), device, {}, timings, stages);
}

std::unique_ptr<pipelines::OffloadStage> offload(const pipelines::FluxT2IPipeline& pipeline, int resident) {
  return std::make_unique<pipelines::OffloadStage>(resident, pipelines::block_modules(pipeline.transformer()), 1);
}

bool holds_panels(const models::Linear& linear) {
  std::lock_guard lock(linear.pack_cache->mutex);
  return linear.pack_cache->packed != nullptr;
}

TEST(Offload, EqualsTheResidentRunExactly) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    pipelines::FluxT2IPipeline resident = pipelines::FluxT2IPipeline::load(data_path("flux_tiny"), dtype);
    const Tensor want = denoise(resident, nullptr, dtype);
    pipelines::FluxT2IPipeline streamed = pipelines::FluxT2IPipeline::load(data_path("flux_tiny"), dtype);
    const int blocks = streamed.transformer().block_count();
    for (int r = 1; r < blocks; ++r)
      for (int run = 0; run < 2; ++run) {  // the second run packs again what the first let go
        pipelines::StageList stages;
        stages.add(offload(streamed, r));
        stages.after_load(streamed.mutable_transformer().mutable_parameters());
        const Tensor got = denoise(streamed, &stages, dtype);
        ASSERT_EQ(max_abs_diff(got, want), 0.0) << "R=" << r << " run " << run;
      }
  }
}

TEST(Offload, BlocksHoldPanelsOnlyInsideTheirWindow) {
  pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(data_path("flux_tiny"), DType::bf16);
  const int blocks = pipeline.transformer().block_count();
  ASSERT_GE(blocks, 3);
  const int r = 1;
  pipelines::StageList stages;
  auto stage = offload(pipeline, r);
  const pipelines::OffloadStage& seen = *stage;
  stages.add(std::move(stage));
  stages.after_load(pipeline.mutable_transformer().mutable_parameters());
  denoise(pipeline, &stages, DType::bf16);
  const auto residency = seen.residency();
  ASSERT_EQ(residency.size(), static_cast<std::size_t>(2 * blocks));  // 2 steps, one forward each
  for (std::size_t call = 0; call < residency.size(); ++call) {
    const int block = static_cast<int>(call) % blocks;
    for (int b : residency[call])
      EXPECT_TRUE(b < r || (b >= block && b < block + r)) << "block " << b << " packed when block " << block << " began";
  }
  // After the run: the resident blocks keep their panels, the streamed ones hold none.
  for (const auto& [name, linear] : pipeline.transformer().parameters().linears()) {
    const bool streamed_block = name.find("transformer_blocks.") != std::string::npos && name.rfind("transformer_blocks.0.", 0) != 0;
    if (streamed_block) {
      EXPECT_FALSE(holds_panels(*linear)) << name;
    }
  }
  EXPECT_TRUE(holds_panels(*pipeline.transformer().parameters().linears().at("transformer_blocks.0.attn.to_q")));
  const nlohmann::ordered_json report = seen.report();
  EXPECT_EQ(report["resident_blocks"], r);
  EXPECT_EQ(report["prefetches"], 2 * (blocks - r));
  EXPECT_EQ(report["blocks_released"], 2 * (blocks - r));
}

TEST(Offload, TheAllocatorHoldsOnlyTheResidentBlocksPanelsAfterARun) {
  pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(data_path("flux_tiny"), DType::f32);
  pipelines::StageList stages;
  stages.add(offload(pipeline, 1));
  stages.after_load(pipeline.mutable_transformer().mutable_parameters());
  denoise(pipeline, &stages, DType::f32);
  default_allocator().empty_cache();
  const std::size_t live_streamed = default_allocator().stats().live_bytes;
  std::size_t streamed_panels = 0;  // the panels of blocks 1.., packed now by hand
  for (const auto& [name, linear] : pipeline.transformer().parameters().linears())
    if (!holds_panels(*linear) && name.find("transformer_blocks.") != std::string::npos) streamed_panels += linear->prepack(1);
  ASSERT_GT(streamed_panels, 0u);
  const std::size_t live_all = default_allocator().stats().live_bytes;
  EXPECT_GE(live_all - live_streamed, streamed_panels);  // size classes round each block up a little
  EXPECT_LE(live_all - live_streamed, streamed_panels + streamed_panels / 4);
}

// The modelled copy stream: every prefetch is a host-link copy of the block's weight bytes (counted
// here from the parameter table), priced at the profile's host_gbps, starting no earlier than the
// block that asks for it, and a slow link shows up as the compute's stall in the modelled time.
TEST(Offload, TheCopyStreamIsModelledAtTheHostLinkFigure) {
  pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(data_path("flux_tiny"), DType::bf16);
  const int blocks = pipeline.transformer().block_count(), r = 1;
  double streamed_bytes = 0;  // one forward's copies: the blocks after the resident one
  for (const auto& [name, linear] : pipeline.transformer().parameters().linears())
    if (name.find("transformer_blocks.") != std::string::npos && name.rfind("transformer_blocks.0.", 0) != 0)
      streamed_bytes += static_cast<double>(linear->weight.nbytes() + (linear->bias.defined() ? linear->bias.nbytes() : 0));
  ASSERT_GT(streamed_bytes, 0);
  const auto run = [&](double host_gbps) {
    DeviceProfile profile = builtin_cpu_profile();
    profile.host_gbps = host_gbps;
    Device device(profile, {.simulate = false, .trace = true});
    pipelines::StageList stages;
    auto stage = offload(pipeline, r);
    const pipelines::OffloadStage& seen = *stage;
    stages.add(std::move(stage));
    stages.after_load(pipeline.mutable_transformer().mutable_parameters());
    pipelines::T2ITimings timings;
    pipeline.denoise(flux_prompt(1), nullptr, small_run(DType::bf16), device, {}, timings, &stages);
    device.synchronize();
    int copies = 0;
    double last_copy_end = 0, last_compute_end = 0;
    for (const KernelRecord& record : device.trace().records())
      if (record.desc.name.rfind("offload.h2d ", 0) != 0) {
        last_compute_end = std::max(last_compute_end, record.modelled_end_s);
      } else {
        ++copies;
        last_copy_end = std::max(last_copy_end, record.modelled_end_s);
        EXPECT_EQ(record.stream_label, "offload.copy");
        EXPECT_NEAR(record.modelled_end_s - record.modelled_start_s,
                    record.desc.bytes / (host_gbps * 1e9) + profile.launch_overhead_us * 1e-6, 1e-12);
      }
    EXPECT_EQ(copies, 2 * (blocks - r));         // 2 steps
    EXPECT_GT(last_compute_end, last_copy_end);  // the last streamed block computes after its copy
    const DeviceStats stats = device.stats();    // copies are not collectives
    EXPECT_EQ(stats.host_copies, static_cast<uint64_t>(copies));
    EXPECT_EQ(stats.kernels_per_unit[static_cast<std::size_t>(Unit::comm)], 0u);
    return std::pair{seen.report(), device.stats().modelled_makespan_s};
  };
  const auto [fast, fast_makespan] = run(37);
  EXPECT_DOUBLE_EQ(fast["modelled_copy_bytes"].get<double>(), 2 * streamed_bytes);
  const double slow_gbps = 1e-4;  // a link so slow that the copies dominate
  const auto [slow, slow_makespan] = run(slow_gbps);
  const double slow_copy_s = 2 * streamed_bytes / (slow_gbps * 1e9);
  EXPECT_GE(slow["modelled_copy_seconds"].get<double>(), slow_copy_s);
  EXPECT_GE(slow_makespan, slow_copy_s);  // the copies run one after another on their stream
  EXPECT_GT(slow["modelled_stall_seconds"].get<double>(), 0.9 * slow_copy_s - fast_makespan);
  EXPECT_LT(fast["modelled_stall_seconds"].get<double>(), slow["modelled_stall_seconds"].get<double>());
}

// A profile without the "links" figures cannot price the copies: the run goes on, unmodelled, and says so.
TEST(Offload, AProfileWithoutLinksLeavesTheCopiesUnmodelled) {
  pipelines::FluxT2IPipeline pipeline = pipelines::FluxT2IPipeline::load(data_path("flux_tiny"), DType::f32);
  DeviceProfile profile = builtin_cpu_profile();
  profile.has_links = false;
  Device device(profile);
  pipelines::StageList stages;
  auto stage = offload(pipeline, 1);
  const pipelines::OffloadStage& seen = *stage;
  stages.add(std::move(stage));
  stages.after_load(pipeline.mutable_transformer().mutable_parameters());
  pipelines::T2ITimings timings;
  pipeline.denoise(flux_prompt(1), nullptr, small_run(DType::f32), device, {}, timings, &stages);
  EXPECT_TRUE(seen.report()["modelled_copy_seconds"].is_null());
  EXPECT_NE(seen.summary().find("not modelled"), std::string::npos) << seen.summary();
}

TEST(Offload, ResidentCountsOutsideTheModelAreErrors) {
  const std::vector<std::string> modules{"blocks.0", "blocks.1", "blocks.2"};
  EXPECT_NE(message_of([&] { pipelines::OffloadStage(0, modules, 1); }).find("--offload 0: the resident blocks must number 1 to 2"),
            std::string::npos);
  EXPECT_NE(message_of([&] { pipelines::OffloadStage(3, modules, 1); }).find("the model has 3 blocks"), std::string::npos);
  pipelines::OffloadStage stage(1, modules, 1);
  const models::BlockState in;
  EXPECT_NE(message_of([&] {
              stage.run_block(
                  {}, {0, 3, "blocks.0"}, in, [](const models::BlockState& s) { return s; }, Stream(nullptr));
            }).find("after_load"),
            std::string::npos);
}

TEST(Offload, MappedPagesAreReleasedAndReadBackOwnedMemoryIsNeverTouched) {
  TempDir dir;
  const std::string path = (dir.path / "w.safetensors").string();
  const Tensor w = random_tensor({64, 1024}, 5, DType::f32, 1.0f);  // 256 KiB: many whole pages
  write_safetensors(path, {{"w", w}});
  const SafetensorsFile file = SafetensorsFile::open(path);
  const Tensor mapped = file.tensor("w");
  ASSERT_TRUE(mapped.storage()->file_mapped());
  const long page = ::sysconf(_SC_PAGESIZE);
  const std::size_t released = mapped.storage()->release_file_pages(0, mapped.nbytes());
  EXPECT_GE(released, mapped.nbytes() - 2 * static_cast<std::size_t>(page));
  EXPECT_EQ(max_abs_diff(mapped, w), 0.0);  // read back from the file
  const Tensor owned = w.clone();
  EXPECT_FALSE(owned.storage()->file_mapped());
  EXPECT_EQ(owned.storage()->release_file_pages(0, owned.nbytes()), 0u);
  EXPECT_EQ(max_abs_diff(owned, w), 0.0);
}

TEST(Offload, PackedPanelsFallUnderTheAllocatorsLimit) {
  // Panels are allocator memory now: a limit below them refuses the packing with the allocator's
  // error naming the request, and nothing is left half made.
  const Tensor w = random_tensor({512, 512}, 9, DType::f32, 1.0f);  // 1 MiB of f32 panels
  default_allocator().empty_cache();
  const std::size_t held = default_allocator().stats().reserved_bytes;
  default_allocator().set_memory_limit(held + (256 << 10));
  const std::string message = message_of([&] { ops::pack_weight(w, DType::f32, 1); });
  default_allocator().set_memory_limit(0);
  EXPECT_NE(message.find("memory limit"), std::string::npos) << message;
  EXPECT_EQ(default_allocator().stats().reserved_bytes, held);
  EXPECT_NE(ops::pack_weight(w, DType::f32, 1), nullptr);  // and without the limit it packs
}

}  // namespace offload_stage_test
}  // namespace cubevec
