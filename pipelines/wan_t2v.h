// Video with a Wan transformer and its causal 3-D VAE (docs/models.md "WanPipeline" and "Wan
// image-to-video"): seeded noise [1, z_dim, 1 + (F - 1) / 4, H / 8, W / 8], the flow-matching loop
// (the raw timestep t = sigma x 1000 goes to the model), real CFG v = v_u + g (v_c - v_u) as one
// fused batch or on two overlapping streams, and the frame-by-frame VAE decode with the latents
// un-normalized per channel. The scheduler is the model's: UniPCMultistepScheduler (what the
// diffusers Wan repos ship) or FlowMatchEulerDiscreteScheduler with a shift.
//
// The family's variants, from the folder (model_index.json and the transformer's config):
//   * text-to-video (WanPipeline): the transformer's in_channels is the VAE's z_dim;
//   * image-to-video (WanImageToVideoPipeline): in_channels is 2 z_dim + 4: every step the latents
//     go in beside the condition [mask (4 channels) ; the encoded first frame (and, FLF2V, last
//     frame) with zero frames between], and, when the transformer has the image branch (Wan2.1),
//     the image encoder's penultimate states of the picture(s) as image tokens;
//   * two experts (Wan2.2 A14B, boundary_ratio in model_index.json): transformer/ runs the steps
//     whose timestep is at or above boundary_ratio x num_train_timesteps with guidance, and
//     transformer_2/ the rest with guidance_2;
//   * text-image-to-video (Wan2.2 TI2V-5B, expand_timesteps in model_index.json, the Wan2.2 VAE's
//     16x): text alone, or a first frame whose encoded latent frame replaces latent frame 0 before
//     every step and after the loop, its tokens at timestep 0 (docs/models.md "Wan2.2 TI2V-5B").
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "media/jpeg.h"
#include "models/autoencoder_kl_wan.h"
#include "models/autoencoder_kl_wan_encoder.h"
#include "models/clip_image_processor.h"
#include "models/clip_vision_model.h"
#include "models/wan_transformer.h"
#include "pipelines/flow_match.h"
#include "pipelines/generation.h"
#include "pipelines/prompt_embeds_file.h"
#include "pipelines/unipc.h"

namespace cubevec::pipelines {

struct T2VOptions {
  int64_t width = 832, height = 480;  // multiples of the VAE's scale (8; Wan2.2's 16) x the transformer's spatial patch
  int64_t frames = 81;                // 1 + 4k
  int steps = 50;
  double guidance = 5.0;  // CFG scale; CFG runs when cfg is not off
  // Two experts: the low-noise expert's CFG scale (diffusers' guidance_scale_2); unset: guidance.
  std::optional<double> guidance_2;
  CfgMode cfg = CfgMode::fused;
  // CFG parallel: the branches on the 2 ranks of this group (pipelines/guidance.h); cfg must be on.
  std::optional<parallel::Communicator> cfg_parallel;
  // Patch-parallel VAE: the ranks of this group share the decode's rows (pipelines/patch_parallel_vae.h).
  std::optional<parallel::Communicator> vae_parallel;
  uint64_t seed = 0;
  Tensor initial_noise{};          // [1, C, T_lat, H/s, W/s] (s the VAE's scale) instead of the seeded noise (parity runs)
  DType activations = DType::f32;  // the transformer's activations: f32 or bf16
  // Image-to-video: the first frame (and, for first-last-frame, the last) as files or pixels,
  // resized to width x height as diffusers' VideoProcessor does (Lanczos). TI2V: the first only.
  std::string image, last_image;
  std::shared_ptr<const media::RgbImage> image_pixels, last_image_pixels;
  // The image encoder's penultimate states [n, L, C] (n pictures) instead of running it (parity runs).
  Tensor image_embeds{};

  bool has_image() const { return !image.empty() || image_pixels; }
  bool has_last_image() const { return !last_image.empty() || last_image_pixels; }
  int64_t latent_frames() const { return (frames - 1) / 4 + 1; }
};

// What a Wan folder's model_index.json says about the pipeline (all optional; no file: text-to-video
// with one transformer).
struct WanModelIndex {
  std::string class_name;                // "WanPipeline", "WanImageToVideoPipeline", or empty
  std::optional<double> boundary_ratio;  // two experts: in (0, 1)
  bool expand_timesteps = false;         // Wan2.2 TI2V's per-token timesteps
  static WanModelIndex load(const std::string& model_dir);
};

// Wan2.2 TI2V's first-frame rule (expand_timesteps with a picture). The model input: latents
// [B, C, T, h, w] with frame 0 replaced by `condition` [1 or B, C, 1, h, w] (diffusers' blend
// (1 - mask) condition + mask latents, which is exactly that for finite values), in latents' dtype.
Tensor wan_first_frame_blend(const Tensor& latents, const Tensor& condition, const Stream& stream);
// The per-token timesteps [batch, T (h/2) (w/2)] (the transformer's token order): 0 for latent
// frame 0's tokens, t for the rest (diffusers' (mask[0][0][:, ::2, ::2] * t).flatten(); the
// stride 2 is the TI2V transformer's spatial patch).
Tensor wan_first_frame_timesteps(float t, int64_t batch, int64_t latent_frames, int64_t latent_h, int64_t latent_w);

// Which expert runs each step: 0 (transformer, high noise) where f32(t) >= f32(boundary_ratio x
// num_train_timesteps) as diffusers compares them, else 1 (transformer_2).
std::vector<int> wan_expert_schedule(const std::vector<float>& timesteps, double boundary_ratio, int64_t num_train_timesteps);
// The image-to-video condition's frame mask [1, 4, T_lat, h, w] (1 where a picture is given): the
// first picture's frame repeated 4 times, then one per frame, viewed as 4 channels per latent frame.
Tensor wan_frame_mask(int64_t frames, int64_t height, int64_t width, bool last_image);

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
  // The low-noise expert (Wan2.2 A14B), or null.
  const models::WanTransformer3DModel* transformer_2() const { return transformer_2_.get(); }
  models::WanTransformer3DModel* mutable_transformer_2() { return transformer_2_.get(); }
  const std::optional<double>& boundary_ratio() const { return boundary_ratio_; }
  const models::AutoencoderKLWan* vae() const { return vae_.get(); }
  const WanSchedulerConfig& scheduler_config() const { return scheduler_; }
  // Image-to-video: the transformer takes the condition beside the latents (a picture is required).
  bool image_to_video() const;
  // Wan2.2 TI2V (expand_timesteps): text-to-video, or text-image-to-video when a first frame is given.
  bool text_image_to_video() const { return expand_timesteps_; }
  // Video pixels per latent pixel: the VAE's spatial scale (8; Wan2.2's VAE 16; 8 without a VAE).
  int64_t spatial_scale() const;
  // What a request leaves out: Wan2.1's 832x480 x 81 frames, 50 steps, CFG 5; TI2V's 1280x704 x 121.
  T2VOptions default_options() const;
  // The latents' channels (the VAE's z_dim; the transformer's in_channels without a VAE).
  int64_t latent_channels() const;
  // The image encoder (Wan2.1 I2V / FLF2V: image_encoder/, a CLIPVisionModel, f32), or null.
  const models::ClipVisionModel* image_encoder() const { return image_encoder_.get(); }
  // Image-to-video: the VAE encoder's peak for options' size (0 without an encoder).
  uint64_t image_encoder_peak_bytes(const T2VOptions& options) const;
  // The expert of each of `steps` steps (all 0 with one transformer).
  std::vector<int> expert_schedule(int steps) const;
  // Image-to-video: the condition [1, 4 + z_dim, T_lat, H/8, W/8] for options' picture(s), as
  // WanImageToVideoPipeline.prepare_latents makes it (the mask, then the encoded video of the
  // picture(s) and zero frames, normalized). TI2V: the picture's latent frame [1, z_dim, 1, H/16,
  // W/16] (the normalized encoder mean of the picture as a one-frame video).
  Tensor image_condition(const T2VOptions& options, const Stream& stream) const;

  // Throws for options this model cannot honour (size, frame count, steps, CFG without a negative).
  void check(const T2VOptions& options, bool have_negative) const;

  // Seeded noise -> latents [1, C, T_lat, H/s, W/s] (f32) on `device`, with the stages' plug points in
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
  std::unique_ptr<models::WanTransformer3DModel> transformer_2_;
  std::optional<double> boundary_ratio_;
  bool expand_timesteps_ = false;
  std::unique_ptr<models::AutoencoderKLWanEncoder> encoder_;  // image-to-video only
  std::string encoder_error_;                                 // why there is none
  std::unique_ptr<models::ClipVisionModel> image_encoder_;    // the image branch's pictures -> tokens
  models::ClipImageProcessorConfig image_processor_;

  // model_index.json's pipeline settings, checked against the models.
  void apply_model_index(const WanModelIndex& index, const std::string& dir);
  // transformer_2/ (Wan2.2 A14B's low-noise expert), checked against the first.
  void add_second_expert(std::unique_ptr<models::WanTransformer3DModel> expert, const std::string& dir, double boundary_ratio);
  // image_encoder/ and image_processor/ when the transformer has the image branch (meta: shapes only).
  void load_image_encoder(const std::string& dir, bool meta);

  // The image encoder's states of options' picture(s) [n, L, image_dim] (options.image_embeds when given).
  Tensor image_embeds(const T2VOptions& options, const Stream& stream) const;
  // The picture(s) at width x height as the VAE encodes them: [1, 3, 1, H, W] each in [-1, 1].
  Tensor picture(const std::string& path, const std::shared_ptr<const media::RgbImage>& pixels, const char* flag,
                 const T2VOptions& o) const;
};

}  // namespace cubevec::pipelines
