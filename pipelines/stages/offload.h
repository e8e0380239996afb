// Weight streaming as a stage: MindIE SD's enable_offload semantics on cubevec's device. The
// Linears of blocks [0, resident) keep their packed panels; when block i starts, block
// i + resident is packed on the copy thread (reading straight from the memory-mapped checkpoint),
// so its packing overlaps block i's compute; once block i (i >= resident) has been queued, its
// packed panels are let go (the queued GEMMs hold them until they run) and so are its weight's
// mapped pages, which the OS reads back from the file when the block is next packed. Peak memory
// then holds the resident blocks and a few in flight instead of every weight twice.
//
// The device models the streaming too, in real and simulate runs alike: each prefetch is a
// host-to-device copy of the block's weight bytes on the copy stream ("offload.copy", a comm-unit
// kernel priced at the profile's links.host_gbps) that starts when block i starts, and block
// i + R's compute waits for it, so the modelled time shows whether the link keeps up.
//
// What it cannot stream: Linears with a kernel (quantized layers hold their own int8 panels) and
// weights that are not mapped from a checkpoint (an f32 copy of bf16 weights stays in memory; its
// packed panels still go). With --cfg streams the host queues the unconditional forward, then the
// conditional one: each forward streams the blocks, so every block is packed twice per step (a
// window that spanned both forwards would hold every block); --cfg fused runs both branches as one
// batch and packs each block once.
//
// Two experts (Wan2.2 A14B: BlockIdentity::model 0 and 1): each model's blocks stream the same way,
// and when a forward of the other model begins, every panel and mapped page of the model that ran
// before is let go: only the active expert stays resident. The switch happens once per run (the
// high-noise expert's steps come first); the next run packs the first expert again.
#pragma once

#include <future>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "device/event.h"
#include "pipelines/stage.h"

namespace cubevec::pipelines {

class OffloadStage : public Stage {
 public:
  // `block_modules`: each flat block's module name ("transformer_blocks.3"); `cube_threads`: what the
  // packing is calibrated for. resident must be in [1, blocks).
  OffloadStage(int resident, std::vector<std::string> block_modules, int cube_threads);
  ~OffloadStage() override;
  std::string name() const override { return "offload"; }
  void after_load(models::ParameterTable& parameters) override;
  void after_load_second_model(models::ParameterTable& parameters) override;
  bool uses_blocks() const override { return true; }
  bool streams_weights() const override { return true; }
  models::BlockState run_block(const models::StepInfo& step, const models::BlockIdentity& id, const models::BlockState& in,
                               const models::BlockCompute& compute, const Stream& stream) override;
  std::string summary() const override;
  nlohmann::ordered_json report() const override;

  // For tests: the blocks (of the model running) whose Linears held packed panels when each block
  // call began, and the most blocks of the other model found packed at a block call.
  std::vector<std::vector<int>> residency() const;
  int other_model_packed_max() const;

 private:
  using Key = std::pair<int, int>;  // (model, block)
  void start_prefetch(Key key, const Stream& stream);
  void wait_prefetch(Key key, const Stream& stream);
  // The modelled host-to-device copy of a block on the copy stream, after the work queued so far on `stream`.
  Event model_copy(Key key, const Stream& stream);
  bool packed(Key key) const;
  // Lets go of every panel and mapped page of `model` (its prefetches finished first).
  void release_model(int model);
  void load_model(models::ParameterTable& parameters);

  int resident_;
  std::vector<std::string> modules_;
  int cube_threads_;
  std::vector<std::vector<std::vector<const models::Linear*>>> linears_;  // per model, per block
  std::vector<std::vector<double>> block_bytes_;                          // per model, per block: the streamed weights' bytes
  mutable std::mutex mutex_;
  std::map<Key, std::future<std::size_t>> in_flight_;  // block -> bytes packed
  std::map<Key, Event> copies_;                        // block -> its latest modelled copy
  std::vector<std::vector<int>> residency_;
  int active_model_ = 0, model_switches_ = 0, other_model_packed_max_ = 0;
  std::size_t switch_released_bytes_ = 0;
  double pack_seconds_ = 0, wait_seconds_ = 0;
  std::size_t packed_bytes_ = 0, released_bytes_ = 0;
  int prefetches_ = 0, releases_ = 0;
  bool copies_modelled_ = true;                                                   // false: the profile has no "links" figures
  double copy_gbps_ = 0, copy_bytes_ = 0, copy_seconds_ = 0, stall_seconds_ = 0;  // modelled
};

// Each flat block's module name, in order (a Flux or Wan transformer's block_identity(i).module).
template <class Transformer>
std::vector<std::string> block_modules(const Transformer& transformer) {
  std::vector<std::string> modules;
  for (int i = 0; i < transformer.block_count(); ++i) modules.push_back(transformer.block_identity(i).module);
  return modules;
}

}  // namespace cubevec::pipelines
