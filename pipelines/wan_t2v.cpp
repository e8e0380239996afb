#include "pipelines/wan_t2v.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <tuple>

#include "media/image_input.h"
#include "ops/vector_ops.h"
#include "pipelines/noise.h"
#include "pipelines/seconds_since.h"
#include "pipelines/patch_parallel_vae.h"
#include "pipelines/tensor_values.h"
#include "base/error.h"
#include "base/strict_json.h"

namespace cubevec::pipelines {

namespace {

// The Wan transformer(s) as the loop sees them: latents [1, C, T, H, W] in (image-to-video: with
// the condition beside them on channels, and the image tokens; TI2V with a picture: with frame 0
// replaced by the picture's latent frame and per-token timesteps, 0 on that frame), the flow out;
// the raw timestep (0..1000) goes to the model. With two experts, the run's expert schedule picks
// the model.
class WanDenoiser : public Denoiser {
 public:
  // experts[e] runs the steps whose schedule entry is e (wan_expert_schedule; empty: expert 0 always).
  struct Experts {
    std::array<const models::WanTransformer3DModel*, 2> models{};
    std::vector<int> schedule;
    const models::WanTransformer3DModel& of(int step) const {
      return *models[schedule.empty() ? 0 : static_cast<std::size_t>(schedule.at(static_cast<std::size_t>(step)))];
    }
  };
  // `condition`: image-to-video's channels, or (first_frame) TI2V's latent frame 0.
  WanDenoiser(Experts experts, Tensor cond, Tensor uncond, Tensor condition, Tensor image_embeds, bool first_frame)
      : experts_(std::move(experts)),
        cond_(std::move(cond)),
        uncond_(std::move(uncond)),
        condition_(std::move(condition)),
        image_(std::move(image_embeds)),
        first_frame_(first_frame) {}

  bool has_uncond() const override { return uncond_.defined(); }

  // What depends only on the timestep or the prompt is computed ahead and handed to the forwards
  // (WanInputs' precomputed fields, the same values): each expert's time embedding for all steps at
  // once at its first step (not with per-token timesteps), the text and image embeddings once per
  // branch. Not when an embedder Linear has a kernel (a timestep policy may change its scales per
  // step) or a Linear hook is set.
  void prepare(const std::vector<float>& timesteps, DType activations, const Stream& /*stream*/) override {
    for (const models::WanTransformer3DModel* m : experts_.models)
      if (m && !m->embedders_are_plain()) return;
    if (models::current_linear_call_hook()) return;
    prepared_.set(timesteps, activations);
  }

  Tensor predict(const Tensor& latents, const models::ForwardContext& ctx, const Stream& s) override {
    const models::CfgBranch branch = ctx.step.branch;
    if (branch != models::CfgBranch::cond && !uncond_.defined()) throw Error("the unconditional branch needs negative embeddings");
    const models::WanTransformer3DModel& model = experts_.of(ctx.step.index);
    const Tensor x = !condition_.defined() ? latents
                     : first_frame_        ? wan_first_frame_blend(latents, condition_, s)
                                           : ops::concat({latents, ops::cast(condition_, latents.dtype(), s)}, 1, s);
    const auto timestep = [&](int64_t batch) {
      return first_frame_ ? wan_first_frame_timesteps(ctx.step.timestep, batch, latents.size(2), latents.size(3), latents.size(4))
                          : filled(batch, ctx.step.timestep);
    };
    const bool image = model.config().has_image_branch();
    models::WanInputs in;
    if (branch == models::CfgBranch::both) {
      if (!both_.defined()) both_ = ops::concat({cond_, uncond_}, 0, s);
      if (image && !image_both_.defined()) image_both_ = ops::concat({image_, image_}, 0, s);
      in = {ops::concat({x, x}, 0, s), timestep(2), both_, image ? image_both_ : Tensor()};
    } else {
      in = {x, timestep(1), branch == models::CfgBranch::cond ? cond_ : uncond_, image ? image_ : Tensor()};
    }
    add_precomputed(in, model, ctx, s);
    return model.forward(in, s, ctx);
  }

 private:
  // The step's rows of what prepare allows to compute ahead, made on first use; nothing when
  // prepare did not run or this is not a step it was given.
  void add_precomputed(models::WanInputs& in, const models::WanTransformer3DModel& model, const models::ForwardContext& ctx,
                       const Stream& s) {
    if (!prepared_.covers(ctx)) return;
    const auto index = static_cast<std::size_t>(ctx.step.index);
    const DType act = prepared_.activations();
    const std::size_t expert = experts_.schedule.empty() ? 0 : static_cast<std::size_t>(experts_.schedule.at(index));
    Ahead& a = ahead_[expert][static_cast<std::size_t>(ctx.step.branch)];
    const int64_t batch = in.hidden_states.size(0);
    if (!first_frame_) {
      if (!a.temb.defined())
        std::tie(a.temb, a.timestep_proj) = model.time_embedding(prepared_.rows(batch, [](float t) { return t; }), s, act);
      in.temb = a.temb.narrow(0, static_cast<int64_t>(index) * batch, batch);
      in.timestep_proj = a.timestep_proj.narrow(0, static_cast<int64_t>(index) * batch, batch);
    }
    if (!a.context.defined()) a.context = model.text_embedding(in.encoder_hidden_states, s, act);
    in.context = a.context;
    if (model.config().has_image_branch()) {
      if (!a.image_context.defined()) a.image_context = model.image_embedding(in.encoder_hidden_states_image, s, act);
      in.image_context = a.image_context;
    }
  }

  struct Ahead {
    Tensor temb, timestep_proj;  // all steps' rows, step after step
    Tensor context, image_context;
  };

  Experts experts_;
  Tensor cond_, uncond_, both_, condition_, image_, image_both_;
  bool first_frame_ = false;
  PreparedRun prepared_;                       // empty: the forwards compute their own
  std::array<std::array<Ahead, 3>, 2> ahead_;  // by expert, then CfgBranch
};

// Two experts' CFG: each step combines with its expert's scale (diffusers' guidance_scale for the
// high-noise expert, guidance_scale_2 for the low-noise one).
class ExpertGuidance : public Guidance {
 public:
  ExpertGuidance(std::unique_ptr<Guidance> high, std::unique_ptr<Guidance> low, std::vector<int> schedule)
      : high_(std::move(high)), low_(std::move(low)), schedule_(std::move(schedule)) {}
  std::string name() const override { return high_->name(); }
  std::vector<models::CfgBranch> branches() const override { return high_->branches(); }
  Tensor velocity(Denoiser& denoiser, const Tensor& latents, models::ForwardContext ctx, Device& device) override {
    Guidance& g = schedule_.at(static_cast<std::size_t>(ctx.step.index)) == 1 ? *low_ : *high_;
    return g.velocity(denoiser, latents, ctx, device);
  }

 private:
  std::unique_ptr<Guidance> high_, low_;
  std::vector<int> schedule_;
};

int64_t num_train_timesteps(const WanSchedulerConfig& config) {
  return std::visit([](const auto& c) { return c.num_train_timesteps; }, config);
}

}  // namespace

std::vector<int> wan_expert_schedule(const std::vector<float>& timesteps, double boundary_ratio, int64_t num_train_timesteps) {
  // diffusers compares the f32 timestep with the Python float in f32.
  const float boundary = static_cast<float>(boundary_ratio * static_cast<double>(num_train_timesteps));
  std::vector<int> experts;
  experts.reserve(timesteps.size());
  for (float t : timesteps) experts.push_back(t >= boundary ? 0 : 1);
  return experts;
}

Tensor wan_first_frame_blend(const Tensor& latents, const Tensor& condition, const Stream& s) {
  const bool fits = latents.dim() == 5 && condition.dim() == 5 && condition.size(2) == 1 &&
                    (condition.size(0) == 1 || condition.size(0) == latents.size(0)) && condition.size(1) == latents.size(1) &&
                    condition.size(3) == latents.size(3) && condition.size(4) == latents.size(4);
  if (!fits)
    throw Error("the first-frame condition " + shape_to_string(condition.shape()) + " does not fit latents " +
                shape_to_string(latents.shape()) + " (expected [1 or B, C, 1, h, w] for latents [B, C, T, h, w])");
  Tensor first = ops::cast(condition, latents.dtype(), s);
  if (first.size(0) != latents.size(0)) first = ops::concat(std::vector<Tensor>(static_cast<std::size_t>(latents.size(0)), first), 0, s);
  if (latents.size(2) == 1) return first;
  return ops::concat({first, latents.narrow(2, 1, latents.size(2) - 1)}, 2, s);
}

Tensor wan_first_frame_timesteps(float t, int64_t batch, int64_t latent_frames, int64_t latent_h, int64_t latent_w) {
  const int64_t per_frame = (latent_h / 2) * (latent_w / 2), tokens = latent_frames * per_frame;
  std::vector<float> values(static_cast<std::size_t>(batch * tokens), t);
  for (int64_t b = 0; b < batch; ++b) std::fill_n(values.begin() + b * tokens, per_frame, 0.0f);
  return Tensor::from_vector(values, {batch, tokens});
}

Tensor wan_frame_mask(int64_t frames, int64_t height, int64_t width, bool last_image) {
  const int64_t latent = (frames - 1) / 4 + 1;
  // The pixel frames' mask with the first repeated 4 times: 4 T_lat entries, viewed as [T_lat, 4].
  std::vector<float> expanded(static_cast<std::size_t>(4 * latent), 0.0f);
  for (int k = 0; k < 4; ++k) expanded[static_cast<std::size_t>(k)] = 1.0f;
  if (last_image && frames > 1) expanded.back() = 1.0f;
  Tensor mask = Tensor::empty({1, 4, latent, height, width}, DType::f32);
  float* m = static_cast<float*>(mask.mutable_data_ptr());
  for (int64_t c = 0; c < 4; ++c)
    for (int64_t t = 0; t < latent; ++t)
      std::fill_n(m + (c * latent + t) * height * width, height * width, expanded[static_cast<std::size_t>(4 * t + c)]);
  return mask;
}

std::string scheduler_name(const WanSchedulerConfig& config) { return make_scheduler(config, 1)->name(); }

std::unique_ptr<Scheduler> make_scheduler(const WanSchedulerConfig& config, int steps) {
  if (const auto* unipc = std::get_if<UniPCConfig>(&config)) {
    auto scheduler = std::make_unique<UniPCMultistepScheduler>(*unipc);
    scheduler->set_timesteps(steps);
    return scheduler;
  }
  auto scheduler = std::make_unique<FlowMatchEulerScheduler>(std::get<FlowMatchConfig>(config));
  scheduler->set_timesteps(steps);  // Wan passes neither sigmas nor mu
  return scheduler;
}

WanT2VPipeline::WanT2VPipeline(std::unique_ptr<models::WanTransformer3DModel> transformer, std::unique_ptr<models::AutoencoderKLWan> vae,
                               WanSchedulerConfig scheduler)
    : transformer_(std::move(transformer)), vae_(std::move(vae)), scheduler_(std::move(scheduler)) {
  if (vae_) {
    const int64_t z = vae_->config().z_dim, in = transformer_->config().in_channels;
    const int64_t i2v = 2 * z + vae_->config().scale_factor_temporal;
    if (in != z && in != i2v)
      throw Error("the VAE's " + std::to_string(z) + " latent channels (z_dim) do not fit the transformer's " + std::to_string(in) +
                  " input channels (text-to-video: z_dim; image-to-video: 2 z_dim + " +
                  std::to_string(vae_->config().scale_factor_temporal) + " = " + std::to_string(i2v) + ")");
  }
  if (const auto* euler = std::get_if<FlowMatchConfig>(&scheduler_); euler && euler->use_dynamic_shifting)
    throw Error("the scheduler config uses dynamic shifting, which the Wan pipeline does not (it needs a fixed 'shift')");
}

bool WanT2VPipeline::image_to_video() const { return vae_ && transformer_->config().in_channels != vae_->config().z_dim; }

int64_t WanT2VPipeline::spatial_scale() const { return vae_ ? vae_->config().spatial_upscale() : 8; }

T2VOptions WanT2VPipeline::default_options() const {
  T2VOptions o;
  if (expand_timesteps_) {  // Wan2.2 TI2V-5B's 720p (diffusers' example and the model card)
    o.width = 1280;
    o.height = 704;
    o.frames = 121;
  }
  return o;
}

int64_t WanT2VPipeline::latent_channels() const { return vae_ ? vae_->config().z_dim : transformer_->config().in_channels; }

uint64_t WanT2VPipeline::image_encoder_peak_bytes(const T2VOptions& o) const {
  return encoder_ ? encoder_->estimate_peak_bytes(1, o.height, o.width) : 0;
}

std::vector<int> WanT2VPipeline::expert_schedule(int steps) const {
  const std::unique_ptr<Scheduler> scheduler = make_scheduler(scheduler_, steps);
  if (!boundary_ratio_) return std::vector<int>(static_cast<std::size_t>(scheduler->steps()), 0);
  return wan_expert_schedule(scheduler->timesteps(), *boundary_ratio_, num_train_timesteps(scheduler_));
}

Tensor WanT2VPipeline::picture(const std::string& path, const std::shared_ptr<const media::RgbImage>& pixels, const char* flag,
                               const T2VOptions& o) const {
  const media::RgbImage resized =
      media::resize_lanczos(pixels ? *pixels : media::read_input_image(path, flag), static_cast<int>(o.width), static_cast<int>(o.height));
  return media::image_to_tensor(resized).reshape({1, 3, 1, o.height, o.width});
}

Tensor WanT2VPipeline::image_condition(const T2VOptions& o, const Stream& s) const {
  if (!image_to_video() && !expand_timesteps_) throw Error("this Wan model is text-to-video (its transformer takes no condition channels)");
  if (!encoder_)
    throw Error("image-to-video needs the VAE's encoder (vae/ holding encoder.* and quant_conv.*), which is missing: " +
                (encoder_error_.empty() ? std::string("the pipeline was made without it") : encoder_error_));
  // TI2V: the picture alone, as a one-frame video.
  if (expand_timesteps_) return encoder_->normalize(encoder_->encode(picture(o.image, o.image_pixels, "--image", o), {}, s).mean, s);
  // The video the VAE encodes: the first picture, zero frames, and (first-last-frame) the last one.
  std::vector<Tensor> parts{picture(o.image, o.image_pixels, "--image", o)};
  const int64_t zeros = o.frames - 1 - (o.has_last_image() ? 1 : 0);
  if (zeros > 0) parts.push_back(Tensor::zeros({1, 3, zeros, o.height, o.width}, DType::f32));
  if (o.has_last_image()) parts.push_back(picture(o.last_image, o.last_image_pixels, "--last-image", o));
  const Tensor video = parts.size() == 1 ? parts[0] : ops::concat(parts, 2, s);
  const Tensor latents = encoder_->normalize(encoder_->encode(video, {}, s).mean, s);
  return ops::concat({wan_frame_mask(o.frames, o.height / spatial_scale(), o.width / spatial_scale(), o.has_last_image()), latents}, 1, s);
}

void WanT2VPipeline::check(const T2VOptions& o, bool have_negative) const {
  // Multiples of the VAE's scale here; the loop below adds the transformer's own patch size.
  const int64_t scale = spatial_scale();
  if (o.width <= 0 || o.height <= 0 || o.width % scale != 0 || o.height % scale != 0)
    throw Error("width and height must be positive multiples of " + std::to_string(scale) + " (the VAE's scale), got " +
                std::to_string(o.width) + "x" + std::to_string(o.height));
  if (o.frames < 1 || (o.frames - 1) % 4 != 0)
    throw Error("--frames must be 1 + 4k (1, 5, 9, 13, ...: the VAE makes 4 frames of each latent frame after the first), got " +
                std::to_string(o.frames));
  if (o.steps < 1) throw Error("steps must be at least 1, got " + std::to_string(o.steps));
  if (o.cfg != CfgMode::off && !have_negative)
    throw Error("--cfg " + std::string(cfg_mode_name(o.cfg)) + " needs negative embeddings (a negative prompt)");
  if (o.guidance_2 && !boundary_ratio_)
    throw Error("--guidance-2 is the low-noise expert's CFG scale; this model has one transformer (no boundary_ratio in model_index.json)");
  if (o.guidance_2 && !(std::isfinite(*o.guidance_2) && *o.guidance_2 >= 0.0))
    throw Error("--guidance-2 must be a finite number of at least 0, got " + std::to_string(*o.guidance_2));
  if (image_to_video()) {
    if (!o.has_image())
      throw Error("--image FIRST.png is required: this is an image-to-video model (its transformer takes " +
                  std::to_string(transformer_->config().in_channels) + " input channels: the latents and the picture's condition)");
    const models::WanConfig& c = transformer_->config();
    if (o.has_last_image() && c.has_image_branch() && c.pos_embed_seq_len == 0)
      throw Error(
          "--last-image (first-last-frame) needs a checkpoint trained for it: this transformer's image branch has no position "
          "table for two pictures (pos_embed_seq_len is null, as in Wan2.1 I2V; Wan2.1 FLF2V has it)");
    if (!o.has_last_image() && c.pos_embed_seq_len > 0)
      throw Error(
          "--last-image LAST.png is required: this checkpoint is first-last-frame (FLF2V: its image branch's position table, "
          "pos_embed_seq_len " +
          std::to_string(c.pos_embed_seq_len) + ", covers two pictures)");
    if (o.has_last_image() && o.frames < 2)
      throw Error("--last-image needs at least 5 frames (the first and the last picture are different frames), got --frames " +
                  std::to_string(o.frames));
  } else if (expand_timesteps_ && o.has_last_image()) {
    throw Error("--last-image: Wan2.2 TI2V takes a first frame only (--image); first-last-frame needs a Wan2.1 FLF2V checkpoint");
  } else if (!expand_timesteps_ && (o.has_image() || o.has_last_image())) {
    throw Error(std::string(o.has_image() ? "--image" : "--last-image") +
                " is for image-to-video models (WanImageToVideoPipeline); this Wan model makes video from text only");
  }
  // The patch grid must tile the latent and fit the RoPE table, checked here so that the error
  // names the flag before any work rather than the RoPE kernel after loading.
  const models::WanConfig& c = transformer_->config();
  const struct {
    const char* flag;
    int64_t value, latent, patch;
  } axes[] = {{"--frames", o.frames, o.latent_frames(), c.patch_size[0]},
              {"--height", o.height, o.height / scale, c.patch_size[1]},
              {"--width", o.width, o.width / scale, c.patch_size[2]}};
  for (const auto& a : axes) {
    if (a.latent % a.patch != 0)
      throw Error(std::string(a.flag) + " " + std::to_string(a.value) + " gives " + std::to_string(a.latent) +
                  " latent positions, not a multiple of the transformer's patch size " + std::to_string(a.patch));
    if (a.latent / a.patch > c.rope_max_seq_len)
      throw Error(std::string(a.flag) + " " + std::to_string(a.value) + " gives " + std::to_string(a.latent / a.patch) +
                  " patches on that axis, above the transformer's rope_max_seq_len " + std::to_string(c.rope_max_seq_len));
  }
}

Tensor WanT2VPipeline::denoise(const PromptEmbeddings& pos, const PromptEmbeddings* neg, const T2VOptions& o, Device& device,
                               const StepCallback& on_step, T2ITimings& timings, StageList* stages) const {
  const models::WanConfig& c = transformer_->config();
  check(o, neg != nullptr);
  for (const PromptEmbeddings* e : {&pos, neg})
    if (e && (e->sequence.dim() != 3 || e->sequence.size(0) != 1 || e->sequence.size(2) != c.text_dim))
      throw Error("the prompt embeddings must be [1, L, " + std::to_string(c.text_dim) + "] for this transformer, got " +
                  shape_to_string(e->sequence.shape()));
  if (o.cfg == CfgMode::fused && !o.cfg_parallel && neg->sequence.size(1) != pos.sequence.size(1))
    throw Error("--cfg fused needs prompt and negative prompt embeddings of one length, got " + std::to_string(pos.sequence.size(1)) +
                " and " + std::to_string(neg->sequence.size(1)) + " (use --cfg streams)");

  const Stream main = device.default_stream();
  const int64_t h = o.height / spatial_scale(), w = o.width / spatial_scale();
  const Shape shape{1, latent_channels(), o.latent_frames(), h, w};
  if (o.initial_noise.defined() && o.initial_noise.shape() != shape)
    throw Error("initial noise must be " + shape_to_string(shape) + " for " + std::to_string(o.frames) + " frames of " +
                std::to_string(o.width) + "x" + std::to_string(o.height) + ", got " + shape_to_string(o.initial_noise.shape()));
  const Tensor noise = o.initial_noise.defined() ? o.initial_noise : gaussian_noise(shape, o.seed);
  const std::unique_ptr<Scheduler> scheduler = make_scheduler(scheduler_, o.steps);
  // Image-to-video: the condition and the image tokens, made once for every step.
  Tensor condition, image_tokens;
  const bool first_frame = expand_timesteps_ && o.has_image();
  if (first_frame && device.simulate()) {
    condition = Tensor::meta({1, latent_channels(), 1, h, w}, DType::f32);
  } else if (first_frame) {
    const auto t0 = std::chrono::steady_clock::now();
    condition = image_condition(o, main);
    timings.image_s += seconds_since(t0);
  } else if (image_to_video() && device.simulate()) {
    // Shape-only: the pictures are neither read nor encoded (their encoders are not modelled).
    condition = Tensor::meta({1, 4 + latent_channels(), o.latent_frames(), h, w}, DType::f32);
    if (c.has_image_branch()) {
      const int64_t pictures = o.has_last_image() ? 2 : 1;
      image_tokens = o.image_embeds.defined() ? o.image_embeds
                     : image_encoder_         ? Tensor::meta({pictures, image_encoder_->config().num_positions(), c.image_dim}, DType::f32)
                                              : image_embeds(o, main);  // the error naming what is missing
    }
  } else if (image_to_video()) {
    const auto t0 = std::chrono::steady_clock::now();
    // Each picture file is read once, for the condition and for the image encoder.
    T2VOptions read = o;
    if (!read.image_pixels) read.image_pixels = std::make_shared<const media::RgbImage>(media::read_input_image(o.image, "--image"));
    if (o.has_last_image() && !read.last_image_pixels)
      read.last_image_pixels = std::make_shared<const media::RgbImage>(media::read_input_image(o.last_image, "--last-image"));
    condition = image_condition(read, main);
    if (c.has_image_branch()) image_tokens = image_embeds(read, main);
    timings.image_s += seconds_since(t0);
  }
  WanDenoiser::Experts experts{{transformer_.get(), transformer_2_.get()}, {}};
  if (transformer_2_) experts.schedule = wan_expert_schedule(scheduler->timesteps(), *boundary_ratio_, num_train_timesteps(scheduler_));
  const std::vector<int> schedule = experts.schedule;
  WanDenoiser denoiser(std::move(experts), pos.sequence, neg ? neg->sequence : Tensor(), condition, image_tokens, first_frame);
  const auto guidance_of = [&](double scale, const std::string& side_stream) {
    return o.cfg_parallel ? make_cfg_parallel_guidance(scale, *o.cfg_parallel) : make_guidance(o.cfg, scale, side_stream);
  };
  std::unique_ptr<Guidance> guidance = guidance_of(o.guidance, "t2v.uncond");
  LoopOptions loop{o.activations, transformer_->block_count()};
  if (transformer_2_) {
    guidance =
        std::make_unique<ExpertGuidance>(std::move(guidance), guidance_of(o.guidance_2.value_or(o.guidance), "t2v.uncond"), schedule);
    // The step caches start over with the second expert: what they hold is the first one's.
    const auto first_low = std::find(schedule.begin(), schedule.end(), 1);
    if (first_low != schedule.begin() && first_low != schedule.end())
      loop.restart_stages_at = static_cast<int>(first_low - schedule.begin());
  }
  StageList none;
  const Tensor latents =
      run_denoising_loop(denoiser, *scheduler, *guidance, stages ? *stages : none, noise, loop, device, on_step, timings);
  // TI2V: the picture's frame goes back in after the last step, as the model saw it every step.
  return first_frame ? wan_first_frame_blend(latents, condition, main) : latents;
}

Tensor WanT2VPipeline::image_embeds(const T2VOptions& o, const Stream& s) const {
  if (o.image_embeds.defined()) return o.image_embeds;
  if (!image_encoder_)
    throw Error("this image-to-video transformer takes image tokens (image_dim " + std::to_string(transformer_->config().image_dim) +
                ") from an image encoder (image_encoder/ + image_processor/), which the folder does not have");
  // The encoder sees the pictures as given (its processor resizes and crops them), not the
  // video-sized ones: diffusers' encode_image(image) runs before the VideoProcessor.
  std::vector<Tensor> pixels{
      models::clip_pixel_values(o.image_pixels ? *o.image_pixels : media::read_input_image(o.image, "--image"), image_processor_)};
  if (o.has_last_image())
    pixels.push_back(models::clip_pixel_values(
        o.last_image_pixels ? *o.last_image_pixels : media::read_input_image(o.last_image, "--last-image"), image_processor_));
  return image_encoder_->penultimate_hidden_state(pixels.size() == 1 ? pixels[0] : ops::concat(pixels, 0, s));
}

void WanT2VPipeline::decode(const Tensor& latents, const T2VOptions& o, Device& device, const FrameSink& sink, T2ITimings& timings) const {
  if (!vae_) throw Error("this model has no VAE (vae/config.json) to decode with");
  const Stream main = device.default_stream();
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<PatchParallelRows> rows;
  if (o.vae_parallel && o.vae_parallel->size() > 1) rows.emplace(*o.vae_parallel, latents.size(3));
  models::WanDecodeOptions decode_options;
  decode_options.rows = rows ? &*rows : nullptr;
  vae_->decode_frames(vae_->unnormalize(latents, main), sink, decode_options, main);
  timings.vae_s = seconds_since(t0);
}

}  // namespace cubevec::pipelines
