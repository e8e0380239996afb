#include "pipelines/guidance.h"

#include <cstdio>

#include "ops/vector_ops.h"
#include "parallel/collectives.h"
#include "base/enum_names.h"

namespace cubevec::pipelines {

namespace {

constexpr auto kCfgModeNames =
    enum_names<CfgMode>("CFG mode", {{CfgMode::off, "off"}, {CfgMode::fused, "fused"}, {CfgMode::streams, "streams"}});

class NoGuidance : public Guidance {
 public:
  std::string name() const override { return "off"; }
  std::vector<models::CfgBranch> branches() const override { return {models::CfgBranch::cond}; }
  Tensor velocity(Denoiser& d, const Tensor& latents, models::ForwardContext ctx, Device& device) override {
    ctx.step.branch = models::CfgBranch::cond;
    return d.predict(latents, ctx, device.default_stream());
  }
};

class FusedCfg : public Guidance {
 public:
  explicit FusedCfg(float scale) : scale_(scale) {}
  std::string name() const override { return "fused batch of 2"; }
  std::vector<models::CfgBranch> branches() const override { return {models::CfgBranch::both}; }
  Tensor velocity(Denoiser& d, const Tensor& latents, models::ForwardContext ctx, Device& device) override {
    const Stream main = device.default_stream();
    ctx.step.branch = models::CfgBranch::both;
    const Tensor both = d.predict(latents, ctx, main);
    return combine_cfg(both.narrow(0, 0, 1), ops::contiguous(both.narrow(0, 1, 1), main), scale_, main);
  }

 private:
  float scale_;
};

class TwoStreamCfg : public Guidance {
 public:
  TwoStreamCfg(float scale, std::string side) : scale_(scale), side_(std::move(side)) {}
  std::string name() const override { return "two streams"; }
  std::vector<models::CfgBranch> branches() const override { return {models::CfgBranch::uncond, models::CfgBranch::cond}; }
  Tensor velocity(Denoiser& d, const Tensor& latents, models::ForwardContext ctx, Device& device) override {
    // The unconditional forward on the side stream overlaps the conditional one on the units; the
    // device orders the combination after both.
    ctx.step.branch = models::CfgBranch::uncond;
    const Tensor vu = d.predict(latents, ctx, device.named_stream(side_));
    ctx.step.branch = models::CfgBranch::cond;
    const Tensor vc = d.predict(latents, ctx, device.default_stream());
    return combine_cfg(vc, vu, scale_, device.default_stream());
  }

 private:
  float scale_;
  std::string side_;
};

class CfgAcrossRanks : public Guidance {
 public:
  CfgAcrossRanks(float scale, parallel::Communicator group) : scale_(scale), group_(std::move(group)) {
    if (group_.size() != 2)
      throw Error("CFG parallel runs the two CFG branches on 2 ranks; its group has " + std::to_string(group_.size()));
  }
  std::string name() const override { return "parallel over 2 ranks"; }
  std::vector<models::CfgBranch> branches() const override { return {mine()}; }
  Tensor velocity(Denoiser& d, const Tensor& latents, models::ForwardContext ctx, Device& device) override {
    const Stream main = device.default_stream();
    ctx.step.branch = mine();
    const Tensor both = parallel::all_gather(d.predict(latents, ctx, main), 0, group_, main, "cfg.velocity");
    return combine_cfg(both.narrow(0, 0, 1), ops::contiguous(both.narrow(0, 1, 1), main), scale_, main);
  }

 private:
  models::CfgBranch mine() const { return group_.rank() == 0 ? models::CfgBranch::cond : models::CfgBranch::uncond; }
  float scale_;
  parallel::Communicator group_;
};

}  // namespace

std::unique_ptr<Guidance> make_cfg_parallel_guidance(double scale, parallel::Communicator group) {
  return std::make_unique<CfgAcrossRanks>(static_cast<float>(scale), std::move(group));
}

CfgMode parse_cfg_mode(std::string_view name) { return kCfgModeNames.parse(name); }
std::string_view cfg_mode_name(CfgMode mode) { return kCfgModeNames.name(mode); }

Tensor combine_cfg(const Tensor& cond, const Tensor& uncond, float scale, const Stream& stream) {
  return ops::muls_add(ops::sub(cond, uncond, stream), uncond, scale, stream);
}

std::unique_ptr<Guidance> make_guidance(CfgMode mode, double scale, const std::string& side_stream) {
  switch (mode) {
    case CfgMode::off: return std::make_unique<NoGuidance>();
    case CfgMode::fused: return std::make_unique<FusedCfg>(static_cast<float>(scale));
    case CfgMode::streams: return std::make_unique<TwoStreamCfg>(static_cast<float>(scale), side_stream);
  }
  throw Error("make_guidance: invalid CFG mode");
}

}  // namespace cubevec::pipelines
