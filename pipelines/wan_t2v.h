// Text-to-video with a Wan2.1 transformer and its causal 3-D VAE (docs/models.md "WanPipeline"):
// seeded noise [1, 16, 1 + (F - 1) / 4, H / 8, W / 8], the FlowMatch Euler loop with Wan's shift
// (the raw timestep t = sigma x 1000 goes to the model), real CFG v = v_u + g (v_c - v_u) as one
// fused batch or on two overlapping streams, and the frame-by-frame VAE decode with the latents
// un-normalized per channel. The scheduler is the model's: UniPCMultistepScheduler (what the
// diffusers Wan2.1 repos ship) or FlowMatchEulerDiscreteScheduler with a shift.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "models/autoencoder_kl_wan.h"
#include "models/wan_transformer.h"
#include "pipelines/flow_match.h"
#include "pipelines/generation.h"
#include "pipelines/prompt_embeds_file.h"
#include "pipelines/unipc.h"

namespace cubevec::pipelines {

struct T2VOptions {
  int64_t width = 832, height = 480;  // multiples of 8 x the transformer's spatial patch
  int64_t frames = 81;                // 1 + 4k
  int steps = 50;
  double guidance = 5.0;  // CFG scale; CFG runs when cfg is not off
  CfgMode cfg = CfgMode::fused;
  // CFG parallel: the branches on the 2 ranks of this group (pipelines/guidance.h); cfg must be on.
  std::optional<parallel::Communicator> cfg_parallel;
  // Patch-parallel VAE: the ranks of this group share the decode's rows (pipelines/patch_parallel_vae.h).
  std::optional<parallel::Communicator> vae_parallel;
  uint64_t seed = 0;
  Tensor initial_noise{};          // [1, C, T_lat, H/8, W/8] instead of the seeded noise (parity runs)
  DType activations = DType::f32;  // the transformer's activations: f32 or bf16

  int64_t latent_frames() const { return (frames - 1) / 4 + 1; }
};

// The model's scheduler/scheduler_config.json: UniPC or FlowMatch Euler.
using WanSchedulerConfig = std::variant<UniPCConfig, FlowMatchConfig>;
std::string scheduler_name(const WanSchedulerConfig& config);  // e.g. "UniPC multistep (order 2, flow shift 3)"
// A scheduler of that configuration with its timesteps set for `steps`.
std::unique_ptr<Scheduler> make_scheduler(const WanSchedulerConfig& config, int steps);

// Receives the decoded frames in order, a chunk at a time: [1, 3, f, H, W] f32 in [-1, 1].
using FrameSink = std::function<void(const Tensor& frames)>;

class WanT2VPipeline {
 public:
  WanT2VPipeline(std::unique_ptr<models::WanTransformer3DModel> transformer, std::unique_ptr<models::AutoencoderKLWan> vae,
                 WanSchedulerConfig scheduler);

  // A diffusers Wan directory: transformer/, vae/, scheduler/ (scheduler_config.json: UniPC or
  // FlowMatch Euler; UniPC with flow shift 3 when absent, as the Wan2.1 480p repos). The
  // transformer's matrices are stored as `dtype`; the VAE is f32.
  static WanT2VPipeline load(const std::string& model_dir, DType dtype = DType::f32, const std::string& variant = "");
  // Shape-only weights for simulate mode: only config files are read (no VAE without vae/config.json).
  static WanT2VPipeline load_meta(const std::string& model_dir, DType dtype = DType::f32);

  const models::WanTransformer3DModel& transformer() const { return *transformer_; }
  models::WanTransformer3DModel& mutable_transformer() { return *transformer_; }
  const models::AutoencoderKLWan* vae() const { return vae_.get(); }
  const WanSchedulerConfig& scheduler_config() const { return scheduler_; }

  // Throws for options this model cannot honour (size, frame count, steps, CFG without a negative).
  void check(const T2VOptions& options, bool have_negative) const;

  // Seeded noise -> latents [1, C, T_lat, H/8, W/8] (f32) on `device`, with the stages' plug points in
  // every forward (none when `stages` is null). `negative` is needed iff options.cfg is not off.
  Tensor denoise(const PromptEmbeddings& positive, const PromptEmbeddings* negative, const T2VOptions& options, Device& device,
                 const StepCallback& on_step, T2ITimings& timings, StageList* stages = nullptr) const;
  // Latents -> frames through `sink` (1 + 4 (T_lat - 1) frames), one latent frame at a time.
  // With options.vae_parallel every rank of that group decodes its band and every sink gets whole frames.
  void decode(const Tensor& latents, const T2VOptions& options, Device& device, const FrameSink& sink, T2ITimings& timings) const;

 private:
  std::unique_ptr<models::WanTransformer3DModel> transformer_;
  std::unique_ptr<models::AutoencoderKLWan> vae_;
  WanSchedulerConfig scheduler_;
};

}  // namespace cubevec::pipelines
