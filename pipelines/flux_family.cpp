// The Flux family (text to image, FluxTransformer2DModel) behind the library's ModelPipeline:
// its defaults (the VAE's sample_size, 28 steps, embedded guidance 3.5, true CFG off at scale 4),
// its text conditioning (CLIP + T5), its checks, memory estimate and report.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "pipelines/flux_t2i.h"
#include "pipelines/image_conditioning.h"
#include "pipelines/family_pipeline_base.h"
#include "base/error.h"

namespace cubevec::pipelines {

namespace {

// AutoencoderKL's decode of an h x w latent (tiled above the config's tile size, as the pipeline
// decodes): the widest activation of a tile times the tensors held at once (a residual block's
// input, norm, SiLU, conv output and shortcut, and those the kernels launched ahead pin: 10,
// measured 8 on the tiny VAEs), plus the picture three times over (the decoded tiles, the blend and
// the result).
uint64_t autoencoder_kl_bytes(const models::AutoencoderKLConfig& c, int64_t latent_h, int64_t latent_w) {
  const int64_t tile = c.tile_latent_size() > 0 ? c.tile_latent_size() : std::max(latent_h, latent_w);
  const int64_t th = std::min(latent_h, tile), tw = std::min(latent_w, tile);
  std::vector<int64_t> channels(c.block_out_channels.rbegin(), c.block_out_channels.rend());
  uint64_t largest = 0;
  int64_t h = th, w = tw;
  for (std::size_t i = 0; i < channels.size(); ++i) {
    const int64_t in = i == 0 ? channels[0] : channels[i - 1];
    largest = std::max(largest, static_cast<uint64_t>(std::max(in, channels[i]) * h * w));
    if (i + 1 < channels.size()) {  // the upsampler's output keeps this block's width at 2x
      h *= 2;
      w *= 2;
      largest = std::max(largest, static_cast<uint64_t>(channels[i] * h * w));
    }
  }
  const uint64_t picture = static_cast<uint64_t>(c.out_channels * latent_h * latent_w * c.upscale() * c.upscale()) * 4;
  return 10 * largest * 4 + 3 * picture + kWorkspaceBytes;
}

// The peak of a Flux request (pipelines/memory_estimate.h says what is counted). `batch`: 2 when
// CFG runs fused, else 1.
MemoryEstimate flux_memory(const FluxT2IPipeline& pipeline, const T2IOptions& o, int64_t text_tokens, int batch, int offload,
                           int cube_threads) {
  const models::FluxConfig& c = pipeline.transformer().config();
  MemoryEstimate e;
  const TransformerBytes transformer =
      transformer_bytes(pipeline.transformer().parameters(), block_modules(pipeline.transformer()), o.activations, offload, cube_threads);
  e.weights = transformer.weights;
  e.packed = transformer.packed;
  if (pipeline.vae()) e.weights += stored_bytes(pipeline.vae()->parameters(), DType::f32);
  // A single-stream block at its widest holds, per token, the joint input and its norm (2 D), the
  // MLP hidden (4 D), q, k, v and the attention output (4 D), their concatenation (5 D) and the
  // output (D), besides the residual stream (2 D): 18 D. The kernels the host may launch ahead of
  // the device (device/stream.cpp) pin about as much again, and the allocator rounds to size
  // classes: measured 39-57 D per token on both tiny models (D = 32 and 128), so 64 D.
  const int64_t multiple = pipeline.size_multiple();
  // A Kontext edit's reference tokens: at most its size bound (FluxT2IPipeline::check).
  const int64_t image_tokens = (o.width / multiple) * (o.height / multiple);
  const int64_t reference_tokens = o.edit ? kontext_reference_pixel_limit(o.width, o.height) / (multiple * multiple) : 0;
  const uint64_t tokens = static_cast<uint64_t>(image_tokens + reference_tokens + text_tokens);
  const uint64_t rope = tokens * static_cast<uint64_t>(c.attention_head_dim) * 2 * 4;
  const uint64_t per_token = 64 * static_cast<uint64_t>(c.inner_dim()) * activation_bytes(o.activations);
  e.denoising = static_cast<uint64_t>(batch) * tokens * per_token + rope + kWorkspaceBytes;
  if (offload == 0) {  // every step's modulation, computed at the first (FluxDenoiser::prepare): 6 + 6, 3 and 2 D a row
    const auto width = static_cast<uint64_t>((12 * c.num_layers + 3 * c.num_single_layers + 2) * c.inner_dim());
    const auto rows = static_cast<uint64_t>(o.steps) * (o.cfg == CfgMode::off ? 1u : 2u);
    e.denoising += rows * width * activation_bytes(o.activations);
  }
  if (pipeline.vae()) {
    const int64_t up = pipeline.vae()->config().upscale();
    e.vae_decode = autoencoder_kl_bytes(pipeline.vae()->config(), o.height / up, o.width / up);
  }
  return e;
}

constexpr int64_t kKontextMaxArea = 1024 * 1024;  // FluxKontextPipeline's max_area default

class FluxModelPipeline : public FamilyPipelineBase<FluxT2IPipeline, T2IOptions> {
 public:
  using FamilyPipelineBase::FamilyPipelineBase;

  std::string family() const override { return "flux"; }
  std::string task() const override { return "t2i"; }
  bool video() const override { return false; }
  bool edits_pictures() const override { return p_.kontext(); }

  Request with_defaults(const Request& request, const std::string&, std::vector<std::string>&) const override {
    const T2IOptions defaults;
    Request r = request;
    // Width and height not given: the model's own size (the VAE's sample_size; 1024 for FLUX.1).
    if (!r.width) r.width = p_.default_image_size();
    if (!r.height) r.height = p_.default_image_size();
    if (!r.num_inference_steps) r.num_inference_steps = defaults.steps;
    if (!r.guidance_scale) r.guidance_scale = defaults.guidance;
    if (!r.true_cfg_scale) r.true_cfg_scale = defaults.cfg_scale;
    if (r.cfg.empty()) r.cfg = "off";
    if (!r.edit && p_.kontext() && r.has_image()) r.edit = true;  // FluxKontextPipeline edits the picture it is given
    if (r.edit.value_or(false)) {
      if (!r.max_area) r.max_area = kKontextMaxArea;
      if (!r.auto_resize) r.auto_resize = true;
      // Kontext's size: the requested one rescaled to max_area at its aspect ratio (once: a request
      // whose defaults are filled in already keeps its size).
      if (!r.size_fitted) {
        const auto [w, h] = kontext_output_size(*r.width, *r.height, *r.max_area, p_.size_multiple());
        r.width = w;
        r.height = h;
        r.size_fitted = true;
      }
      return r;
    }
    if (r.has_image() && !r.strength) r.strength = 0.6;  // diffusers' default for image-to-image and inpainting
    return r;
  }

  CfgMode cfg_mode(const Request& request) const override { return request.cfg.empty() ? CfgMode::off : parse_cfg_mode(request.cfg); }
  TextInput text_input() const override { return TextInput::of(p_.transformer().config()); }

  TextConditioning one_shot_text(const std::string& model_dir, const Request& request, const TextSettings& settings, bool simulate,
                                 const Stream& stream) const override {
    return flux_text(model_dir, request.text, settings, cfg_mode(request) != CfgMode::off, simulate, p_.transformer().config(), stream);
  }

  void check(const Request& request, const RunContext& run, bool have_negative) const override {
    if (request.sparse && request.sparse->type == ops::SparseType::rf_v2)
      throw Error(
          "--sparse rf_v2 keeps the first frame's blocks whole (MindIE SD's RainFusion), and an image is one frame: it would skip "
          "nothing; use --sparse ada_bsa for images");
    if (request.num_frames && *request.num_frames != 1)
      throw Error("--frames " + std::to_string(*request.num_frames) + ": this is an image model (Flux): leave it out or give 1");
    if (!request.edit.value_or(false) && (request.max_area || request.auto_resize))
      throw Error(std::string(request.max_area ? "--max-area" : "--no-auto-resize") +
                  " applies to a Kontext edit (--edit, or a FluxKontextPipeline folder with --image)");
    p_.check(options(request, run), have_negative);
  }

  MemoryEstimate estimate_memory(const Request& request, const RunContext& run, int64_t text_tokens, int offload,
                                 int cube_threads) const override {
    const T2IOptions o = options(request, run);
    return flux_memory(p_, o, text_tokens, o.cfg == CfgMode::off ? 1 : 2, offload, cube_threads);
  }

  void decode(const Tensor& latents, const Request& request, const RunContext& run, Device& device, const DecodedSink& sink,
              T2ITimings& timings) const override {
    sink(p_.decode(latents, options(request, run), device, timings));
  }

  std::vector<std::string> describe(const Request& r, const RunContext& run, const std::string& dtype, const DeviceProfile& profile,
                                    bool simulate) const override {
    const models::FluxConfig& mc = p_.transformer().config();
    char line[512];
    std::snprintf(
        line, sizeof line,
        "%lldx%lld, %d steps, cfg %s, %s, transformer %lld+%lld blocks x %lld wide (%s), profile %s: %d Cube + %d Vector thread(s)%s",
        static_cast<long long>(*r.width), static_cast<long long>(*r.height), *r.num_inference_steps, r.cfg.c_str(),
        mc.guidance_embeds ? ("guidance " + std::to_string(*r.guidance_scale)).c_str() : "no guidance embedding",
        static_cast<long long>(mc.num_layers), static_cast<long long>(mc.num_single_layers), static_cast<long long>(mc.inner_dim()),
        dtype.c_str(), profile.name.c_str(), profile.cube_threads, profile.vector_threads, simulate ? ", SIMULATED (modelled times)" : "");
    std::vector<std::string> lines{line};
    if (run.vae_parallel && p_.vae()) {
      const int64_t up = p_.vae()->config().upscale();
      const int64_t tiles = p_.vae()->tile_count(*r.height / up, *r.width / up);
      if (tiles == 1) lines.push_back("--vae-parallel: the latent fits in one VAE tile, so every rank decodes it whole (no speedup)");
      else
        lines.push_back("--vae-parallel: " + std::to_string(tiles) + " VAE tiles dealt over " + std::to_string(run.vae_parallel->size()) +
                        " ranks");
    }
    return lines;
  }

  nlohmann::ordered_json report_fields(const Request& r) const override {
    nlohmann::ordered_json j = {
        {"width", *r.width}, {"height", *r.height}, {"steps", *r.num_inference_steps}, {"cfg", r.cfg}, {"seed", r.seed}};
    if (r.edit.value_or(false)) {
      j["mode"] = "edit";
      j["max_area"] = *r.max_area;
      j["auto_resize"] = *r.auto_resize;
    } else if (r.has_image()) {
      j["mode"] = r.has_mask() ? "inpaint" : "img2img";
      j["strength"] = *r.strength;
      j["denoising_steps"] = *r.num_inference_steps - img2img_start_step(*r.num_inference_steps, *r.strength);
    }
    return j;
  }

 private:
  T2IOptions options(const Request& r, const RunContext& run) const override {
    T2IOptions o;
    o.width = *r.width;
    o.height = *r.height;
    o.steps = *r.num_inference_steps;
    o.guidance = *r.guidance_scale;
    o.cfg = cfg_mode(r);
    o.cfg_scale = *r.true_cfg_scale;
    o.seed = r.seed;
    o.image = r.image;
    o.mask = r.mask_image;
    o.image_pixels = r.image_pixels;
    o.mask_pixels = r.mask_pixels;
    if (r.strength) o.strength = *r.strength, o.strength_given = true;
    o.edit = r.edit.value_or(false);
    o.auto_resize = r.auto_resize.value_or(true);
    o.activations = run.activations;
    o.cfg_parallel = run.cfg_parallel;
    o.vae_parallel = run.vae_parallel;
    return o;
  }
};

std::unique_ptr<ModelPipeline> load_flux_meta(const std::string& model_dir, DType dtype) {
  return std::make_unique<FluxModelPipeline>(FluxT2IPipeline::load_meta(model_dir, dtype));
}

}  // namespace

ModelFamilyEntry flux_family() { return {"flux", "FluxTransformer2DModel", &load_flux_meta}; }

}  // namespace cubevec::pipelines
