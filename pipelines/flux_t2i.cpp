#include "pipelines/flux_t2i.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "ops/vector_ops.h"
#include "media/image_input.h"
#include "pipelines/image_conditioning.h"
#include "pipelines/noise.h"
#include "pipelines/patch_parallel_vae.h"
#include "pipelines/tensor_values.h"
#include "base/error.h"
#include "tensor/half.h"
#include "base/interrupt.h"

namespace cubevec::pipelines {

namespace {

// The scheduler when the model directory has none: FLUX.1-dev's (docs/models.md, "FlowMatch Euler
// scheduler").
FlowMatchConfig flux_scheduler_of(const std::string& model_dir) {
  const std::string path = model_dir + "/scheduler/scheduler_config.json";
  if (std::filesystem::exists(path)) return FlowMatchConfig::load(path);
  print_notice_once(model_dir +
                    " has no scheduler/scheduler_config.json; using FLUX.1-dev's (FlowMatchEulerDiscreteScheduler, "
                    "shift 3, dynamic shifting)");
  FlowMatchConfig c;
  c.shift = 3.0;
  c.use_dynamic_shifting = true;
  return c;
}

}  // namespace

FluxT2IPipeline::FluxT2IPipeline(std::unique_ptr<models::FluxTransformer2DModel> transformer,
                                 std::unique_ptr<models::AutoencoderKLDecoder> vae, FlowMatchConfig scheduler)
    : transformer_(std::move(transformer)), vae_(std::move(vae)), scheduler_(std::move(scheduler)) {
  if (vae_ && vae_->config().latent_channels * 4 != transformer_->config().in_channels)
    throw Error("the VAE's " + std::to_string(vae_->config().latent_channels) + " latent channels do not pack into the transformer's " +
                std::to_string(transformer_->config().in_channels) + " input channels (expected 4 x latent channels)");
}

FluxT2IPipeline FluxT2IPipeline::load(const std::string& dir, DType dtype, const std::string& variant) {
  if (!std::filesystem::is_directory(dir + "/transformer"))
    throw Error(dir + ": not a diffusers Flux model directory (expected transformer/, vae/ and scheduler/)");
  auto vae = std::make_unique<models::AutoencoderKLDecoder>(models::load_autoencoder_kl(dir + "/vae", DType::f32, variant));
  FluxT2IPipeline p(models::FluxTransformer2DModel::load(dir + "/transformer", dtype, variant), std::move(vae), flux_scheduler_of(dir));
  p.kontext_ = names_kontext_pipeline(dir);
  // The encoder, for image inputs; a VAE saved without it still generates from text.
  try {
    p.encoder_ = std::make_unique<models::AutoencoderKLEncoder>(models::load_autoencoder_kl_encoder(dir + "/vae", DType::f32, variant));
  } catch (const Interrupted&) {
    throw;
  } catch (const Error& e) {
    p.encoder_error_ = e.what();
  }
  return p;
}

FluxT2IPipeline FluxT2IPipeline::load_meta(const std::string& dir, DType dtype) {
  if (!std::filesystem::is_directory(dir + "/transformer"))
    throw Error(dir + ": not a diffusers Flux model directory (expected transformer/, vae/ and scheduler/)");
  auto transformer = std::make_unique<models::FluxTransformer2DModel>(models::FluxConfig::load(dir + "/transformer/config.json"));
  models::make_meta_parameters(transformer->parameters(), dtype);
  std::unique_ptr<models::AutoencoderKLDecoder> vae;
  if (std::filesystem::exists(dir + "/vae/config.json")) {
    vae = std::make_unique<models::AutoencoderKLDecoder>(models::AutoencoderKLConfig::load(dir + "/vae/config.json"));
    models::make_meta_parameters(vae->parameters(), DType::f32);
  }
  FluxT2IPipeline p(std::move(transformer), std::move(vae), flux_scheduler_of(dir));
  p.kontext_ = names_kontext_pipeline(dir);
  return p;
}

int64_t FluxT2IPipeline::size_multiple() const { return 2 * (vae_ ? vae_->config().upscale() : 8); }

void FluxT2IPipeline::check(const T2IOptions& o, bool have_negative) const {
  const int64_t multiple = size_multiple();
  if (o.width <= 0 || o.height <= 0 || o.width % multiple != 0 || o.height % multiple != 0)
    throw Error("width and height must be positive multiples of " + std::to_string(multiple) + " for this model, got " +
                std::to_string(o.width) + "x" + std::to_string(o.height));
  if (o.steps < 1) throw Error("steps must be at least 1, got " + std::to_string(o.steps));
  if (o.cfg != CfgMode::off && !have_negative)
    throw Error("--cfg " + std::string(cfg_mode_name(o.cfg)) + " needs negative embeddings (a negative prompt)");
  if (o.edit) {
    if (!o.has_image()) throw Error("--edit needs --image (the picture to edit)");
    if (o.has_mask()) throw Error("--mask applies to inpainting; a Kontext edit takes the picture and the prompt only");
    if (o.strength_given)
      throw Error("--strength applies to image-to-image; a Kontext edit runs every step from noise with the picture as a reference");
    // The reference's size now (a picture too small fails before any work); with --no-auto-resize it
    // keeps the picture's own size, bounded so its tokens cannot dwarf the output's.
    const media::RgbImage source = o.image_pixels ? *o.image_pixels : media::read_input_image(o.image, "--image");
    const int64_t upscale = multiple / 2;
    const auto [rw, rh] = kontext_reference_size(source.width, source.height, o.auto_resize, upscale, multiple);
    const int64_t limit = kontext_reference_pixel_limit(o.width, o.height);
    if (rw * rh > limit)
      throw Error("--image is " + std::to_string(source.width) + "x" + std::to_string(source.height) +
                  ": with --no-auto-resize the Kontext reference keeps that size, " + std::to_string(rw * rh / (multiple * multiple)) +
                  " tokens beside the output's " + std::to_string(o.width * o.height / (multiple * multiple)) +
                  "; give a reference of at most " + std::to_string(limit) +
                  " pixels (4x the output's, or Kontext's largest preferred "
                  "size), or leave auto-resize on");
    return;
  }
  if (o.has_mask() && !o.has_image()) throw Error("--mask needs --image (the picture to inpaint)");
  if (o.strength_given && !o.has_image()) throw Error("--strength applies with --image (how much of the picture is repainted)");
  if (o.has_image()) {
    img2img_start_step(o.steps, o.strength);
    // Read now, so a bad picture fails before any weight loads.
    if (!o.image_pixels) (void)media::read_input_image(o.image, "--image");
    if (!o.mask_pixels && !o.mask.empty()) (void)media::read_input_image(o.mask, "--mask");
  }
}

Tensor FluxT2IPipeline::image_latents(const T2IOptions& o, const Stream& stream) const {
  if (!encoder_)
    throw Error("--image needs the VAE's encoder, and this model's cannot be loaded: " +
                (encoder_error_.empty() ? std::string("the pipeline was made without it") : encoder_error_));
  const media::RgbImage picture = media::resize_lanczos(o.image_pixels ? *o.image_pixels : media::read_input_image(o.image, "--image"),
                                                        static_cast<int>(o.width), static_cast<int>(o.height));
  // diffusers' retrieve_latents(vae.encode(image), generator): a sample of the latent distribution.
  const models::LatentDistribution d = models::latent_distribution(encoder_->moments(media::image_to_tensor(picture), stream), stream);
  const Tensor z = d.sample(gaussian_noise(d.mean.shape(), encode_sample_seed(o.seed)));
  const auto& c = encoder_->config();
  return ops::mul(ops::sub(z, filled(1, static_cast<float>(c.shift_factor)), stream), filled(1, static_cast<float>(c.scaling_factor)),
                  stream);
}

Tensor FluxT2IPipeline::reference_latents(const T2IOptions& o, const Stream& stream) const {
  if (!encoder_)
    throw Error("--edit needs the VAE's encoder, and this model's cannot be loaded: " +
                (encoder_error_.empty() ? std::string("the pipeline was made without it") : encoder_error_));
  const media::RgbImage source = o.image_pixels ? *o.image_pixels : media::read_input_image(o.image, "--image");
  const int64_t upscale = encoder_->config().upscale();
  const auto [width, height] = kontext_reference_size(source.width, source.height, o.auto_resize, upscale, 2 * upscale);
  const media::RgbImage picture = media::resize_lanczos(source, static_cast<int>(width), static_cast<int>(height));
  // retrieve_latents(..., sample_mode="argmax"): the distribution's mean, not a sample.
  const models::LatentDistribution d = models::latent_distribution(encoder_->moments(media::image_to_tensor(picture), stream), stream);
  const auto& c = encoder_->config();
  return ops::mul(ops::sub(d.mean, filled(1, static_cast<float>(c.shift_factor)), stream), filled(1, static_cast<float>(c.scaling_factor)),
                  stream);
}

namespace {

// The Flux transformer as the loop sees it: packed latents in, packed velocity out. diffusers passes
// t / 1000 and the model multiplies by 1000 again (in bf16 both in bf16, as diffusers' bf16 run).
class FluxDenoiser : public Denoiser {
 public:
  // `reference` (Kontext): packed reference tokens appended to the latents' every call (the inputs'
  // img_ids then cover both), and the prediction cut back to the latents' tokens.
  FluxDenoiser(const models::FluxTransformer2DModel& model, models::FluxInputs cond, std::optional<models::FluxInputs> uncond,
               double guidance, Tensor reference = {})
      : model_(model),
        cond_(std::move(cond)),
        uncond_(std::move(uncond)),
        guidance_(static_cast<float>(guidance)),
        reference_(std::move(reference)) {}

  bool has_uncond() const override { return uncond_.has_value(); }

  // The modulation depends only on the timestep, the guidance and the pooled text: each branch's is
  // computed for all steps at its first step, one GEMM per Linear instead of a GEMV per step (the
  // same values row for row). Not when a modulation Linear is quantized (a timestep policy may
  // change its scales per step) or a Linear hook sees the calls.
  void prepare(const std::vector<float>& timesteps, DType activations, const Stream& /*stream*/) override {
    if (!model_.modulation_is_plain() || models::current_linear_call_hook()) return;
    prepared_.set(timesteps, activations);
  }

  Tensor predict(const Tensor& latents, const models::ForwardContext& ctx, const Stream& s) override {
    const models::CfgBranch branch = ctx.step.branch;
    const int batch = branch == models::CfgBranch::both ? 2 : 1;
    const Tensor tokens = reference_.defined() ? ops::concat({latents, ops::cast(reference_, latents.dtype(), s)}, 1, s) : latents;
    if (branch != models::CfgBranch::cond && !uncond_) throw Error("the unconditional branch needs negative embeddings");
    models::FluxInputs in = branch == models::CfgBranch::uncond ? *uncond_ : cond_;
    if (branch == models::CfgBranch::both) {
      if (!both_) {
        both_ = cond_;
        both_->encoder_hidden_states = ops::concat({cond_.encoder_hidden_states, uncond_->encoder_hidden_states}, 0, s);
        both_->pooled_projections = ops::concat({cond_.pooled_projections, uncond_->pooled_projections}, 0, s);
      }
      in = *both_;
      in.hidden_states = ops::concat({tokens, tokens}, 0, s);
    } else {
      in.hidden_states = tokens;
    }
    in.timestep = filled(batch, model_time(ctx.step.timestep, ctx.activations));
    if (model_.config().guidance_embeds) in.guidance = filled(batch, guidance_);
    in.modulation = precomputed_modulation(in, batch, ctx, s);
    const Tensor velocity = model_.forward(in, s, ctx);
    return reference_.defined() ? velocity.narrow(1, 0, latents.size(1)) : velocity;
  }

 private:
  static float model_time(float timestep, DType activations) {
    if (activations == DType::bf16) return bf16_to_f32(f32_to_bf16(bf16_to_f32(f32_to_bf16(timestep)) / 1000.0f));
    return timestep / 1000.0f;
  }

  // This step's rows of the branch's table, or null (prepare did not run, or this is not the step
  // it was given: the forward then computes its own).
  std::shared_ptr<const models::FluxModulation> precomputed_modulation(const models::FluxInputs& in, int batch,
                                                                       const models::ForwardContext& ctx, const Stream& s) {
    if (!prepared_.covers(ctx)) return nullptr;
    auto& table = tables_[static_cast<std::size_t>(ctx.step.branch)];
    if (!table) {
      const DType act = prepared_.activations();
      const int64_t steps = prepared_.steps();
      const Tensor guidance = model_.config().guidance_embeds ? filled(steps * batch, guidance_) : Tensor();
      const std::vector<Tensor> pooled(static_cast<std::size_t>(steps), in.pooled_projections);
      table = std::make_shared<const models::FluxModulation>(model_.modulation(
          prepared_.rows(batch, [&](float t) { return model_time(t, act); }), guidance, ops::concat(pooled, 0, s), s, act));
    }
    return std::make_shared<const models::FluxModulation>(table->slice(int64_t{ctx.step.index} * batch, batch));
  }

  const models::FluxTransformer2DModel& model_;
  models::FluxInputs cond_;
  std::optional<models::FluxInputs> uncond_, both_;
  float guidance_;
  Tensor reference_;
  PreparedRun prepared_;                                                 // empty: the forwards compute their own modulation
  std::array<std::shared_ptr<const models::FluxModulation>, 3> tables_;  // by CfgBranch: all steps' rows
};

}  // namespace

Tensor FluxT2IPipeline::denoise(const PromptEmbeddings& pos, const PromptEmbeddings* neg, const T2IOptions& o, Device& device,
                                const StepCallback& on_step, T2ITimings& timings, StageList* stages) const {
  const models::FluxConfig& c = transformer_->config();
  check(o, neg != nullptr);
  const int64_t multiple = size_multiple();
  for (const PromptEmbeddings* e : {&pos, neg}) {
    if (!e) continue;
    if (e->sequence.dim() != 3 || e->sequence.size(0) != 1 || e->sequence.size(2) != c.joint_attention_dim)
      throw Error("the prompt embeddings must be [1, L, " + std::to_string(c.joint_attention_dim) + "] for this transformer, got " +
                  shape_to_string(e->sequence.shape()));
    if (e->pooled.dim() != 2 || e->pooled.size(0) != 1 || e->pooled.size(1) != c.pooled_projection_dim)
      throw Error("the pooled embeddings must be [1, " + std::to_string(c.pooled_projection_dim) + "] for this transformer, got " +
                  shape_to_string(e->pooled.shape()));
  }
  if (o.cfg == CfgMode::fused && !o.cfg_parallel && neg->sequence.size(1) != pos.sequence.size(1))
    throw Error("--cfg fused needs prompt and negative prompt embeddings of one length, got " + std::to_string(pos.sequence.size(1)) +
                " and " + std::to_string(neg->sequence.size(1)) + " (use --cfg streams)");

  const Stream main = device.default_stream();
  const int64_t upscale = multiple / 2, lh = o.height / upscale, lw = o.width / upscale;
  const int64_t channels = c.in_channels / 4, tokens = (lh / 2) * (lw / 2);
  // Noise as (1, C, H, W), then packed (docs/models.md "Flux latent packing").
  if (o.initial_noise.defined() && o.initial_noise.shape() != Shape{1, channels, lh, lw})
    throw Error("initial noise must be " + shape_to_string(Shape{1, channels, lh, lw}) + " for a " + std::to_string(o.width) + "x" +
                std::to_string(o.height) + " image, got " + shape_to_string(o.initial_noise.shape()));
  const Tensor noise_unpacked = o.initial_noise.defined() ? o.initial_noise : gaussian_noise({1, channels, lh, lw}, o.seed);
  const Tensor noise = models::pack_latents(noise_unpacked, main);
  FlowMatchEulerScheduler scheduler(scheduler_);
  scheduler.set_flux_timesteps(o.steps, tokens);
  LoopOptions loop{o.activations, transformer_->block_count()};
  Tensor initial = noise;
  Tensor image_packed, mask_packed;  // inpainting: the picture's latents and the mask (1: repaint), packed
  Tensor reference, reference_ids;   // Kontext: the picture's packed latents and their img_ids
  if (o.edit) {
    if (device.simulate()) throw Error("--edit runs the VAE's encoder on the picture; --simulate does not model it");
    const Tensor latents = reference_latents(o, main);
    reference = models::pack_latents(latents, main);
    reference_ids = kontext_reference_ids(latents.size(2), latents.size(3));
  } else if (o.has_image()) {
    if (device.simulate()) throw Error("--image: image-to-image runs the VAE's encoder on the picture; --simulate does not model it");
    // FluxImg2ImgPipeline: the schedule from get_timesteps' start, the picture's latents noised to
    // its first sigma (scale_noise); strength 1 starts from the noise alone.
    scheduler.begin_at(img2img_start_step(o.steps, o.strength));
    const Tensor latents = image_latents(o, main);
    initial = models::pack_latents(scale_noise(latents, ops::contiguous(noise_unpacked, main), scheduler.sigmas().front()), main);
    if (o.has_mask()) {
      // FluxInpaintPipeline: after each step the known region is the picture's latents noised to
      // the next step's level (the last step: the picture's latents themselves).
      image_packed = models::pack_latents(latents, main);
      const Tensor mask =
          inpaint_mask(o.mask_pixels ? *o.mask_pixels : media::read_input_image(o.mask, "--mask"), o.width, o.height, lh, lw);
      mask_packed = models::pack_latents(mask.expand({1, channels, lh, lw}).contiguous(), main);
      loop.after_step = [&](int i, const Tensor& stepped) {
        const int steps = scheduler.steps();
        const Tensor known =
            i + 1 < steps ? scale_noise(image_packed, noise, scheduler.sigmas()[static_cast<std::size_t>(i + 1)]) : image_packed;
        const Tensor s = stepped.contiguous(), k = known.contiguous(), m = mask_packed.contiguous();
        Tensor out = Tensor::empty(s.shape(), DType::f32);
        const float *ps = s.data<float>(), *pk = k.data<float>(), *pm = m.data<float>();
        float* po = out.mutable_data<float>();
        for (int64_t j = 0; j < out.numel(); ++j) po[j] = (1.0f - pm[j]) * pk[j] + pm[j] * ps[j];
        return out;
      };
    }
  }

  const Tensor img_ids = reference.defined() ? ops::concat({models::flux_image_ids(lh, lw), reference_ids}, 0, main).contiguous()
                                             : models::flux_image_ids(lh, lw);
  auto inputs_of = [&](const PromptEmbeddings& e) {
    models::FluxInputs in;
    in.img_ids = img_ids;
    in.txt_ids = Tensor::zeros({e.sequence.size(1), 3}, DType::f32);
    in.encoder_hidden_states = e.sequence;
    in.pooled_projections = e.pooled;
    return in;
  };
  FluxDenoiser denoiser(*transformer_, inputs_of(pos), neg ? std::optional(inputs_of(*neg)) : std::nullopt, o.guidance, reference);
  const std::unique_ptr<Guidance> guidance =
      o.cfg_parallel ? make_cfg_parallel_guidance(o.cfg_scale, *o.cfg_parallel) : make_guidance(o.cfg, o.cfg_scale, "t2i.uncond");
  StageList none;
  return run_denoising_loop(denoiser, scheduler, *guidance, stages ? *stages : none, initial, loop, device, on_step, timings);
}

Tensor FluxT2IPipeline::decode(const Tensor& packed, const T2IOptions& o, Device& device, T2ITimings& timings) const {
  if (!vae_) throw Error("this model has no VAE (vae/config.json) to decode with");
  const Stream main = device.default_stream();
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t upscale = vae_->config().upscale();
  const Tensor latents = models::unpack_latents(packed, o.height / upscale, o.width / upscale, main);
  // z = latents / scaling_factor + shift_factor (docs/models.md "FluxPipeline").
  const auto& vc = vae_->config();
  const Tensor z = ops::add(ops::div(latents, filled(1, static_cast<float>(vc.scaling_factor)), main),
                            filled(1, static_cast<float>(vc.shift_factor)), main);
  std::optional<PatchParallelTiles> tiles;
  if (o.vae_parallel && o.vae_parallel->size() > 1) tiles.emplace(*o.vae_parallel);
  models::TileOptions tile_options;
  tile_options.sharing = tiles ? &*tiles : nullptr;
  Tensor image = vae_->decode_tiled(z, tile_options, main);
  if (!device.simulate()) image.data_ptr();
  timings.vae_s = seconds_since(t0);
  return image;
}

}  // namespace cubevec::pipelines
