#include "pipelines/stages/offload.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "device/cost_model.h"
#include "device/device.h"
#include "models/layers.h"
#include "pipelines/seconds_since.h"
#include "tensor/caching_allocator.h"
#include "base/error.h"

namespace cubevec::pipelines {

OffloadStage::OffloadStage(int resident, std::vector<std::string> block_modules, int cube_threads)
    : resident_(resident), modules_(std::move(block_modules)), cube_threads_(cube_threads) {
  const int blocks = static_cast<int>(modules_.size());
  if (resident < 1 || resident >= blocks)
    throw Error("--offload " + std::to_string(resident) + ": the resident blocks must number 1 to " + std::to_string(blocks - 1) +
                " (the model has " + std::to_string(blocks) + " blocks; 0 turns offload off)");
}

OffloadStage::~OffloadStage() {
  // A run that failed may leave prefetches running: they touch the Linears, so finish them first.
  for (auto& [key, future] : in_flight_)
    if (future.valid()) future.wait();
}

void OffloadStage::after_load(models::ParameterTable& parameters) {
  linears_.clear();
  block_bytes_.clear();
  load_model(parameters);
}

void OffloadStage::after_load_second_model(models::ParameterTable& parameters) {
  if (linears_.size() != 1) throw Error("offload: the second model's layers come after the first's (after_load)");
  load_model(parameters);
}

void OffloadStage::load_model(models::ParameterTable& parameters) {
  std::vector<std::vector<const models::Linear*>> linears(modules_.size());
  std::vector<double> bytes(modules_.size(), 0.0);
  for (std::size_t b = 0; b < modules_.size(); ++b) {
    const std::string prefix = modules_[b] + ".";
    for (const auto& [name, linear] : parameters.linears())
      if (name.compare(0, prefix.size(), prefix) == 0) {
        linears[b].push_back(linear);
        if (!linear->kernel && linear->weight.defined())  // what streaming moves (a kernel's panels stay resident)
          bytes[b] += static_cast<double>(linear->weight.nbytes() + (linear->bias.defined() ? linear->bias.nbytes() : 0));
      }
  }
  linears_.push_back(std::move(linears));
  block_bytes_.push_back(std::move(bytes));
}

bool OffloadStage::packed(Key key) const {
  for (const models::Linear* linear : linears_[static_cast<std::size_t>(key.first)][static_cast<std::size_t>(key.second)]) {
    std::lock_guard lock(linear->pack_cache->mutex);
    if (linear->pack_cache->packed) return true;
  }
  return false;
}

Event OffloadStage::model_copy(Key key, const Stream& stream) {
  const int block = key.second;
  const DeviceProfile& profile = stream.device().profile();
  if (!profile.has_links) {
    std::lock_guard lock(mutex_);
    copies_modelled_ = false;
    return {};
  }
  KernelDesc copy_kernel;
  copy_kernel.name = "offload.h2d " + modules_[static_cast<std::size_t>(block)];
  copy_kernel.unit = Unit::comm;
  copy_kernel.link = KernelDesc::Link::host;
  copy_kernel.bytes = block_bytes_[static_cast<std::size_t>(key.first)][static_cast<std::size_t>(block)];
  const Stream copy = stream.device().named_stream("offload.copy");
  copy.wait(stream.record());               // the copy starts with the block that asks for it
  copy.launch(copy_kernel, {}, {}, [] {});  // the packing on the copy thread is the real work
  const Event done = copy.record();
  std::lock_guard lock(mutex_);
  copy_gbps_ = profile.host_gbps;
  copy_bytes_ += copy_kernel.bytes;
  copy_seconds_ += model_kernel(profile, copy_kernel).total_s;
  return done;
}

void OffloadStage::start_prefetch(Key key, const Stream& stream) {
  {
    std::lock_guard lock(mutex_);
    const auto& blocks = linears_[static_cast<std::size_t>(key.first)];
    if (key.second >= static_cast<int>(blocks.size()) || in_flight_.count(key)) return;
    const std::vector<const models::Linear*> layers = blocks[static_cast<std::size_t>(key.second)];
    const int threads = cube_threads_;
    // The copy engine: its own thread, so the packing (memory-bound reads of the mapped checkpoint)
    // overlaps the Cube and Vector units' work on the previous blocks.
    in_flight_[key] = std::async(std::launch::async, [this, layers, threads] {
      const auto t0 = std::chrono::steady_clock::now();
      std::size_t bytes = 0;
      for (const models::Linear* linear : layers) linear->prefetch_weight_pages();  // the disk reads ahead of the packing
      for (const models::Linear* linear : layers) {
        bytes += linear->prepack(threads);
        linear->release_weight_pages();  // packed: the mapped bytes are not read again
      }
      std::lock_guard pack_lock(mutex_);
      pack_seconds_ += seconds_since(t0);
      return bytes;
    });
    ++prefetches_;
  }
  const Event copied = model_copy(key, stream);
  std::lock_guard lock(mutex_);
  copies_[key] = copied;
}

void OffloadStage::wait_prefetch(Key key, const Stream& stream) {
  std::future<std::size_t> future;
  Event copied;
  {
    std::lock_guard lock(mutex_);
    if (const auto found = copies_.find(key); found != copies_.end()) copied = found->second;
    const auto found = in_flight_.find(key);
    if (found != in_flight_.end()) {
      future = std::move(found->second);
      in_flight_.erase(found);
    }
  }
  if (copied.state()) {
    const double stall = std::max(0.0, copied.state()->modelled_time_s() - stream.modelled_time_s());
    stream.wait(copied);
    std::lock_guard lock(mutex_);
    stall_seconds_ += stall;
  }
  if (!future.valid()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t bytes = future.get();  // rethrows a failed packing (out of memory, a limit)
  std::lock_guard lock(mutex_);
  wait_seconds_ += seconds_since(t0);
  packed_bytes_ += bytes;
}

void OffloadStage::release_model(int model) {
  std::vector<std::future<std::size_t>> pending;
  {
    std::lock_guard lock(mutex_);
    for (auto it = in_flight_.begin(); it != in_flight_.end();)
      if (it->first.first == model) {
        pending.push_back(std::move(it->second));
        it = in_flight_.erase(it);
      } else {
        ++it;
      }
  }
  for (auto& future : pending) future.wait();  // the packing threads touch the Linears
  std::size_t released = 0;
  for (const auto& block : linears_[static_cast<std::size_t>(model)])
    for (const models::Linear* linear : block) released += linear->release_packed() + linear->release_weight_pages();
  std::lock_guard lock(mutex_);
  switch_released_bytes_ += released;
  ++model_switches_;
}

models::BlockState OffloadStage::run_block(const models::StepInfo& /*step*/, const models::BlockIdentity& id, const models::BlockState& in,
                                           const models::BlockCompute& compute, const Stream& stream) {
  if (linears_.empty()) throw Error("offload: the stage was not given the model's layers (after_load)");
  if (id.model < 0 || id.model >= static_cast<int>(linears_.size()))
    throw Error("offload: model " + std::to_string(id.model) + " was not given to the stage (after_load_second_model)");
  const int blocks = static_cast<int>(linears_[static_cast<std::size_t>(id.model)].size());
  if (id.index < 0 || id.index >= blocks)
    throw Error("offload: block " + std::to_string(id.index) + " is outside the model's " + std::to_string(blocks));
  // Another expert takes over: the one that ran before lets go of all it holds.
  if (id.model != active_model_) {
    release_model(active_model_);
    active_model_ = id.model;
  }
  {
    std::vector<int> now;
    int other = 0;
    for (int b = 0; b < blocks; ++b)
      if (packed({id.model, b})) now.push_back(b);
    for (std::size_t m = 0; m < linears_.size(); ++m)
      if (static_cast<int>(m) != id.model)
        for (int b = 0; b < static_cast<int>(linears_[m].size()); ++b) other += packed({static_cast<int>(m), b}) ? 1 : 0;
    std::lock_guard lock(mutex_);
    residency_.push_back(std::move(now));
    other_model_packed_max_ = std::max(other_model_packed_max_, other);
  }
  // The window ahead: while block i computes, block i + R is packed (blocks 0..R-1 of a forward
  // thus bring in R..2R-1, the first blocks that are not resident).
  if (id.index + resident_ < blocks) start_prefetch({id.model, id.index + resident_}, stream);
  wait_prefetch({id.model, id.index}, stream);
  models::BlockState out = compute(in);
  std::size_t released = 0;
  const auto& layers = linears_[static_cast<std::size_t>(id.model)][static_cast<std::size_t>(id.index)];
  if (id.index >= resident_)
    for (const models::Linear* linear : layers) released += linear->release_packed();
  else
    for (const models::Linear* linear : layers) released += linear->release_weight_pages();
  std::lock_guard lock(mutex_);
  released_bytes_ += released;
  if (id.index >= resident_) ++releases_;
  return out;
}

int OffloadStage::other_model_packed_max() const {
  std::lock_guard lock(mutex_);
  return other_model_packed_max_;
}

std::vector<std::vector<int>> OffloadStage::residency() const {
  std::lock_guard lock(mutex_);
  return residency_;
}

std::string OffloadStage::summary() const {
  std::lock_guard lock(mutex_);
  const std::string resident = resident_ == 1 ? "block 0 resident" : "blocks 0-" + std::to_string(resident_ - 1) + " resident";
  std::string modelled;
  if (!copies_modelled_) {
    modelled = "; the copies are not modelled (the device profile has no \"links\" figures)";
  } else if (copy_bytes_ > 0) {
    char text[256];
    std::snprintf(text, sizeof text, "; modelled: %s over the host link at %g GB/s in %.3f s, compute stalled %.3f s for it",
                  human_bytes(static_cast<std::size_t>(copy_bytes_)).c_str(), copy_gbps_, copy_seconds_, stall_seconds_);
    modelled = text;
  }
  std::string experts;
  if (linears_.size() > 1) {
    char line[160];
    std::snprintf(line, sizeof line, "; %d expert switch%s released %s", model_switches_, model_switches_ == 1 ? "" : "es",
                  human_bytes(switch_released_bytes_).c_str());
    experts = line;
  }
  if (packed_bytes_ == 0)
    return resident + "; nothing packed ahead (no weights in memory: simulate mode, or quantized layers)" + experts + modelled;
  char text[320];
  const double hidden = pack_seconds_ > 0 ? std::max(0.0, 1.0 - wait_seconds_ / pack_seconds_) : 1.0;
  std::snprintf(text, sizeof text,
                "%s; %d block packing%s on the copy thread, %s in %.3f s; compute waited %.3f s for them (%.0f%% hidden); %s of "
                "mapped weight pages released",
                resident.c_str(), prefetches_, prefetches_ == 1 ? "" : "s", human_bytes(packed_bytes_).c_str(), pack_seconds_,
                wait_seconds_, 100 * hidden, human_bytes(released_bytes_).c_str());
  return text + experts + modelled;
}

nlohmann::ordered_json OffloadStage::report() const {
  std::lock_guard lock(mutex_);
  nlohmann::ordered_json j = {{"resident_blocks", resident_},  {"prefetches", prefetches_},     {"packed_bytes", packed_bytes_},
                              {"pack_seconds", pack_seconds_}, {"wait_seconds", wait_seconds_}, {"released_page_bytes", released_bytes_},
                              {"blocks_released", releases_}};
  if (linears_.size() > 1) {
    j["expert_switches"] = model_switches_;
    j["expert_switch_released_bytes"] = switch_released_bytes_;
  }
  // The modelled copy stream (null without the profile's links figures).
  j["modelled_copy_bytes"] = copy_bytes_;
  j["modelled_copy_seconds"] = copies_modelled_ ? nlohmann::ordered_json(copy_seconds_) : nlohmann::ordered_json();
  j["modelled_stall_seconds"] = copies_modelled_ ? nlohmann::ordered_json(stall_seconds_) : nlohmann::ordered_json();
  return j;
}

}  // namespace cubevec::pipelines
