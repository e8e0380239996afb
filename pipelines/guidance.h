// How classifier-free guidance runs, behind one interface so the denoising loop is the same for
// every mode: off (one forward per step), fused (cond and uncond as one batch of 2), streams (cond
// and uncond forwards on two streams of the device, overlapping on the units); later, across ranks.
// Every mode combines v = v_u + scale (v_c - v_u).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "device/device.h"
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

// v_u + scale (v_c - v_u), the one CFG combination (in the velocities' dtype).
Tensor combine_cfg(const Tensor& cond, const Tensor& uncond, float scale, const Stream& stream);

}  // namespace cubevec::pipelines
