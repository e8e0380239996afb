// How classifier-free guidance runs, behind one interface so the denoising loop is the same for
// every mode: off (one forward per step), fused (cond and uncond as one batch of 2), streams (cond
// and uncond forwards on two streams of the device, overlapping on the units), or across ranks (CFG
// parallel: each branch on its own rank, the velocities all-gathered).
// Every mode combines v = v_u + scale (v_c - v_u).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "device/device.h"
#include "parallel/communicator.h"
#include "pipelines/denoiser.h"

namespace cubevec::pipelines {

enum class CfgMode { off, fused, streams };
CfgMode parse_cfg_mode(std::string_view name);  // "off", "fused", "streams"
std::string_view cfg_mode_name(CfgMode mode);

class Guidance {
 public:
  virtual ~Guidance() = default;
  virtual std::string name() const = 0;
  // The branches its forwards carry (what per-branch state a stage keeps).
  virtual std::vector<models::CfgBranch> branches() const = 0;
  // The guided velocity at `latents` for the step in `ctx` (whose branch this sets per forward).
  virtual Tensor velocity(Denoiser& denoiser, const Tensor& latents, models::ForwardContext ctx, Device& device) = 0;
};

// The guidance for `mode` with `scale` (unused when off). Streams use the device stream `side_stream`.
std::unique_ptr<Guidance> make_guidance(CfgMode mode, double scale, const std::string& side_stream = "cfg.uncond");

// CFG parallel over `group` (2 ranks): rank 0 of it computes the conditional branch, rank 1 the
// unconditional; both all-gather the two velocities and combine them, so every rank goes on with the
// same latents.
std::unique_ptr<Guidance> make_cfg_parallel_guidance(double scale, parallel::Communicator group);

// v_u + scale (v_c - v_u), the one CFG combination (in the velocities' dtype).
Tensor combine_cfg(const Tensor& cond, const Tensor& uncond, float scale, const Stream& stream);

}  // namespace cubevec::pipelines
