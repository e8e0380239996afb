#include "pipelines/wan_t2v.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "ops/vector_ops.h"
#include "pipelines/noise.h"
#include "pipelines/patch_parallel_vae.h"
#include "base/error.h"
#include "base/strict_json.h"

namespace cubevec::pipelines {

namespace {

Tensor filled(int64_t n, float value) { return Tensor::from_vector(std::vector<float>(static_cast<std::size_t>(n), value), {n}); }

// The model's scheduler: UniPC or FlowMatch Euler by _class_name; the Wan2.1 480p repos' UniPC
// (flow shift 3) when the directory has none.
WanSchedulerConfig scheduler_of(const std::string& model_dir) {
  const std::string path = model_dir + "/scheduler/scheduler_config.json";
  if (!std::filesystem::exists(path)) {
    print_notice_once(model_dir +
                      " has no scheduler/scheduler_config.json; using the Wan2.1 480p repositories' "
                      "(UniPCMultistepScheduler, flow shift 3)");
    UniPCConfig c;
    c.flow_shift = 3.0;
    return c;
  }
  const nlohmann::json json = read_json_file(path);
  if (json.is_object() && json.contains("_class_name") && !json["_class_name"].is_string())
    throw Error(path + ": '_class_name' must be a string (UniPCMultistepScheduler or FlowMatchEulerDiscreteScheduler), got " +
                json["_class_name"].dump());
  if (json.is_object() && json.value("_class_name", std::string()) == "UniPCMultistepScheduler") return UniPCConfig::from_json(json, path);
  return FlowMatchConfig::from_json(json, path);
}

// The Wan transformer as the loop sees it: latents [1, C, T, H, W] in, the flow out; the raw
// timestep (0..1000) goes to the model.
class WanDenoiser : public Denoiser {
 public:
  WanDenoiser(const models::WanTransformer3DModel& model, Tensor cond, Tensor uncond)
      : model_(model), cond_(std::move(cond)), uncond_(std::move(uncond)) {}

  bool has_uncond() const override { return uncond_.defined(); }

  Tensor predict(const Tensor& latents, const models::ForwardContext& ctx, const Stream& s) override {
    const models::CfgBranch branch = ctx.step.branch;
    if (branch != models::CfgBranch::cond && !uncond_.defined()) throw Error("the unconditional branch needs negative embeddings");
    if (branch == models::CfgBranch::both) {
      if (!both_.defined()) both_ = ops::concat({cond_, uncond_}, 0, s);
      return model_.forward({ops::concat({latents, latents}, 0, s), filled(2, ctx.step.timestep), both_}, s, ctx);
    }
    return model_.forward({latents, filled(1, ctx.step.timestep), branch == models::CfgBranch::cond ? cond_ : uncond_}, s, ctx);
  }

 private:
  const models::WanTransformer3DModel& model_;
  Tensor cond_, uncond_, both_;
};

}  // namespace

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
  if (vae_ && vae_->config().z_dim != transformer_->config().in_channels)
    throw Error("the VAE's " + std::to_string(vae_->config().z_dim) + " latent channels (z_dim) do not match the transformer's " +
                std::to_string(transformer_->config().in_channels) + " input channels");
  if (const auto* euler = std::get_if<FlowMatchConfig>(&scheduler_); euler && euler->use_dynamic_shifting)
    throw Error("the scheduler config uses dynamic shifting, which the Wan pipeline does not (it needs a fixed 'shift')");
}

WanT2VPipeline WanT2VPipeline::load(const std::string& dir, DType dtype, const std::string& variant) {
  if (!std::filesystem::is_directory(dir + "/transformer"))
    throw Error(dir + ": not a diffusers Wan model directory (expected transformer/, vae/ and scheduler/)");
  auto vae = std::make_unique<models::AutoencoderKLWan>(models::load_autoencoder_kl_wan(dir + "/vae", DType::f32, variant));
  return WanT2VPipeline(models::WanTransformer3DModel::load(dir + "/transformer", dtype, variant), std::move(vae), scheduler_of(dir));
}

WanT2VPipeline WanT2VPipeline::load_meta(const std::string& dir, DType dtype) {
  if (!std::filesystem::is_directory(dir + "/transformer"))
    throw Error(dir + ": not a diffusers Wan model directory (expected transformer/, vae/ and scheduler/)");
  auto transformer = std::make_unique<models::WanTransformer3DModel>(models::WanConfig::load(dir + "/transformer/config.json"));
  models::make_meta_parameters(transformer->parameters(), dtype);
  std::unique_ptr<models::AutoencoderKLWan> vae;
  if (std::filesystem::exists(dir + "/vae/config.json")) {
    vae = std::make_unique<models::AutoencoderKLWan>(models::AutoencoderKLWanConfig::load(dir + "/vae/config.json"));
    models::make_meta_parameters(vae->parameters(), DType::f32);
  }
  return WanT2VPipeline(std::move(transformer), std::move(vae), scheduler_of(dir));
}

void WanT2VPipeline::check(const T2VOptions& o, bool have_negative) const {
  // Multiples of 8 for the VAE here; the loop below adds the transformer's own patch size.
  if (o.width <= 0 || o.height <= 0 || o.width % 8 != 0 || o.height % 8 != 0)
    throw Error("width and height must be positive multiples of 8 (the VAE's scale), got " + std::to_string(o.width) + "x" +
                std::to_string(o.height));
  if (o.frames < 1 || (o.frames - 1) % 4 != 0)
    throw Error("--frames must be 1 + 4k (1, 5, 9, 13, ...: the VAE makes 4 frames of each latent frame after the first), got " +
                std::to_string(o.frames));
  if (o.steps < 1) throw Error("steps must be at least 1, got " + std::to_string(o.steps));
  if (o.cfg != CfgMode::off && !have_negative)
    throw Error("--cfg " + std::string(cfg_mode_name(o.cfg)) + " needs negative embeddings (a negative prompt)");
  // The patch grid must tile the latent and fit the RoPE table, checked here so that the error
  // names the flag before any work rather than the RoPE kernel after loading.
  const models::WanConfig& c = transformer_->config();
  const struct {
    const char* flag;
    int64_t value, latent, patch;
  } axes[] = {{"--frames", o.frames, o.latent_frames(), c.patch_size[0]},
              {"--height", o.height, o.height / 8, c.patch_size[1]},
              {"--width", o.width, o.width / 8, c.patch_size[2]}};
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
  const Shape shape{1, c.in_channels, o.latent_frames(), o.height / 8, o.width / 8};
  if (o.initial_noise.defined() && o.initial_noise.shape() != shape)
    throw Error("initial noise must be " + shape_to_string(shape) + " for " + std::to_string(o.frames) + " frames of " +
                std::to_string(o.width) + "x" + std::to_string(o.height) + ", got " + shape_to_string(o.initial_noise.shape()));
  const Tensor noise = o.initial_noise.defined() ? o.initial_noise : gaussian_noise(shape, o.seed);
  const std::unique_ptr<Scheduler> scheduler = make_scheduler(scheduler_, o.steps);
  WanDenoiser denoiser(*transformer_, pos.sequence, neg ? neg->sequence : Tensor());
  const std::unique_ptr<Guidance> guidance =
      o.cfg_parallel ? make_cfg_parallel_guidance(o.guidance, *o.cfg_parallel) : make_guidance(o.cfg, o.guidance, "t2v.uncond");
  StageList none;
  return run_denoising_loop(denoiser, *scheduler, *guidance, stages ? *stages : none, noise, {o.activations, transformer_->block_count()},
                            device, on_step, timings);
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
