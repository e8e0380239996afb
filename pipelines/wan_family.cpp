// The Wan family (WanTransformer3DModel: text-to-video, image-to-video, first-last-frame, two
// experts, TI2V) behind the library's ModelPipeline: its defaults (the folder's
// generation_defaults.json, else Wan2.1's 832x480, 81 frames, 50 steps, CFG 5 fused; TI2V-5B's
// 1280x704 x 121), its text
// conditioning (umT5), its checks, memory estimate and report.
#include <algorithm>
#include <cstdio>

#include "pipelines/generation_defaults.h"
#include "pipelines/family_pipeline_base.h"
#include "pipelines/patch_parallel_vae.h"
#include "pipelines/wan_t2v.h"
#include "base/error.h"

namespace cubevec::pipelines {

namespace {

// The peak of a Wan request (pipelines/memory_estimate.h says what is counted). `batch`: 2 when
// CFG runs fused, else 1.
MemoryEstimate wan_memory(const WanT2VPipeline& pipeline, const T2VOptions& o, int64_t text_tokens, int batch, int offload,
                          int cube_threads) {
  const models::WanConfig& c = pipeline.transformer().config();
  MemoryEstimate e;
  const TransformerBytes transformer =
      transformer_bytes(pipeline.transformer().parameters(), block_modules(pipeline.transformer()), o.activations, offload, cube_threads);
  e.weights = transformer.weights;
  e.packed = transformer.packed;
  // Two experts: both resident (the second's weights and packed panels too).
  if (const models::WanTransformer3DModel* second = pipeline.transformer_2()) {
    const TransformerBytes t2 = transformer_bytes(second->parameters(), block_modules(*second), o.activations, offload, cube_threads);
    e.weights += t2.weights;
    // Under --offload only the active expert's blocks are packed (the other's go at the switch).
    e.packed = offload > 0 ? std::max(e.packed, t2.packed) : e.packed + t2.packed;
  }
  if (pipeline.vae()) e.weights += stored_bytes(pipeline.vae()->parameters(), DType::f32);
  if (const models::ClipVisionModel* clip = pipeline.image_encoder()) e.weights += stored_bytes(clip->parameters(), DType::f32);
  // A Wan block holds, per video token, the residual stream and its norm (2 D), q, k, v and the
  // self-attention output (4 D), the cross-attention query and output (2 D), and the FFN hidden
  // before and after its activation (2 ffn_dim): 8 D + 2 F. The kernels launched ahead of the
  // device pin about as much again: measured 2.1x that on the tiny model, so 24 D + 4 F.
  const int64_t h = o.height / pipeline.spatial_scale(), w = o.width / pipeline.spatial_scale();
  const uint64_t tokens = static_cast<uint64_t>((o.latent_frames() / c.patch_size[0]) * (h / c.patch_size[1]) * (w / c.patch_size[2]));
  const uint64_t per_token = 24 * static_cast<uint64_t>(c.inner_dim()) + 4 * static_cast<uint64_t>(c.ffn_dim);
  const uint64_t text = static_cast<uint64_t>(text_tokens) * 2 * static_cast<uint64_t>(c.inner_dim());  // cross-attention k, v
  const uint64_t rope = tokens * static_cast<uint64_t>(c.attention_head_dim) * 2 * 4;
  e.denoising = static_cast<uint64_t>(batch) * (tokens * per_token + text) * activation_bytes(o.activations) + rope + kWorkspaceBytes;
  if (pipeline.vae()) e.vae_decode = static_cast<uint64_t>(pipeline.vae()->estimate_peak_bytes(1, h, w));
  const bool first_frame = pipeline.text_image_to_video() && o.has_image();
  if (pipeline.image_to_video() || first_frame) {
    // The video the encoder reads ([1, 3, F, H, W] f32; TI2V: one frame), its working set, and the
    // condition kept for every step; the encoder's weights are the VAE file's other half.
    const uint64_t video = 3 * static_cast<uint64_t>((first_frame ? 1 : o.frames) * o.height * o.width) * 4;
    const uint64_t condition = static_cast<uint64_t>(first_frame ? pipeline.latent_channels() * h * w
                                                                 : (4 + pipeline.latent_channels()) * o.latent_frames() * h * w) *
                               4;
    e.denoising += condition * static_cast<uint64_t>(batch);
    if (pipeline.vae()) e.vae_decode = std::max(e.vae_decode, video + pipeline.image_encoder_peak_bytes(o));
  }
  return e;
}

class WanModelPipeline : public FamilyPipelineBase<WanT2VPipeline, T2VOptions> {
 public:
  using FamilyPipelineBase::FamilyPipelineBase;

  std::string family() const override { return "wan"; }
  std::string task() const override { return "t2v"; }
  bool video() const override { return true; }

  // The settings the request leaves out, from the folder's generation_defaults.json (the shipped
  // tinywan's 64x64 x 17 frames instead of Wan2.1's 832x480 x 81), else the model's (Wan2.1's;
  // TI2V-5B's 1280x704 x 121).
  Request with_defaults(const Request& request, const std::string& model_dir, std::vector<std::string>& from_defaults) const override {
    const GenerationDefaults d = GenerationDefaults::load(model_dir);
    const T2VOptions model = p_.default_options();
    Request r = request;
    const auto take = [&](const char* flag, const auto& file_value, auto& field, auto fallback) {
      if (field) return;
      if (file_value) {
        field = *file_value;
        from_defaults.push_back(flag);
      } else {
        field = fallback;
      }
    };
    take("--width", d.width, r.width, model.width);
    take("--height", d.height, r.height, model.height);
    take("--frames", d.frames, r.num_frames, model.frames);
    take("--steps", d.steps, r.num_inference_steps, model.steps);
    take("--guidance", d.guidance, r.guidance_scale, model.guidance);
    if (r.cfg.empty()) r.cfg = std::string(cfg_mode_name(model.cfg));
    return r;
  }

  const models::ParameterTable* second_expert_parameters() const override {
    return p_.transformer_2() ? &p_.transformer_2()->parameters() : nullptr;
  }
  models::ParameterTable* mutable_second_expert_parameters() override {
    return p_.mutable_transformer_2() ? &p_.mutable_transformer_2()->mutable_parameters() : nullptr;
  }

  CfgMode cfg_mode(const Request& request) const override { return request.cfg.empty() ? CfgMode::fused : parse_cfg_mode(request.cfg); }
  TextInput text_input() const override { return TextInput::of(p_.transformer().config()); }

  TextConditioning one_shot_text(const std::string& model_dir, const Request& request, const TextSettings& settings, bool simulate,
                                 const Stream& stream) const override {
    return wan_text(model_dir, request.text, settings, cfg_mode(request) != CfgMode::off, simulate, p_.transformer().config(), stream);
  }

  void check(const Request& request, const RunContext& run, bool have_negative) const override {
    if (request.true_cfg_scale) throw Error("--cfg-scale is Flux's true CFG scale; Wan's CFG scale is --guidance");
    const char* flag = request.has_mask()    ? "--mask"
                       : request.strength    ? "--strength"
                       : request.edit        ? "--edit"
                       : request.max_area    ? "--max-area"
                       : request.auto_resize ? "--no-auto-resize"
                                             : nullptr;
    if (flag)
      throw Error(std::string(flag) + " is for Flux pictures (image-to-image, inpainting, Kontext editing); a Wan model takes --image " +
                  "(and --last-image) as the first (and last) frame of an image-to-video model");
    p_.check(options(request, run), have_negative);
    if (run.vae_parallel) check_row_split(run.vae_parallel->size(), *request.height / p_.spatial_scale());
  }

  MemoryEstimate estimate_memory(const Request& request, const RunContext& run, int64_t text_tokens, int offload,
                                 int cube_threads) const override {
    const T2VOptions o = options(request, run);
    return wan_memory(p_, o, text_tokens, o.cfg == CfgMode::off ? 1 : 2, offload, cube_threads);
  }

  void decode(const Tensor& latents, const Request& request, const RunContext& run, Device& device, const DecodedSink& sink,
              T2ITimings& timings) const override {
    p_.decode(latents, options(request, run), device, sink, timings);
  }

  std::vector<std::string> describe(const Request& r, const RunContext& run, const std::string& dtype, const DeviceProfile& profile,
                                    bool simulate) const override {
    const T2VOptions o = options(r, run);
    const models::WanConfig& mc = p_.transformer().config();
    char line[512];
    std::snprintf(line, sizeof line,
                  "%lld frames of %lldx%lld (latent %lld x %lld x %lld), %d steps, cfg %s (scale %.2f), transformer %lld blocks x %lld "
                  "wide (%s), profile %s: %d Cube + %d Vector thread(s)%s",
                  static_cast<long long>(o.frames), static_cast<long long>(o.width), static_cast<long long>(o.height),
                  static_cast<long long>(o.latent_frames()), static_cast<long long>(o.height / p_.spatial_scale()),
                  static_cast<long long>(o.width / p_.spatial_scale()), o.steps, r.cfg.c_str(), o.guidance,
                  static_cast<long long>(mc.num_layers), static_cast<long long>(mc.inner_dim()), dtype.c_str(), profile.name.c_str(),
                  profile.cube_threads, profile.vector_threads, simulate ? ", SIMULATED (modelled times)" : "");
    std::vector<std::string> lines{"scheduler: " + scheduler_name(p_.scheduler_config()), line};
    if (p_.transformer_2()) {
      const std::vector<int> experts = p_.expert_schedule(o.steps);
      const auto high = std::count(experts.begin(), experts.end(), 0);
      if (o.cfg == CfgMode::off)  // no guidance scale applies
        std::snprintf(line, sizeof line, "two experts (boundary_ratio %.3g): transformer/ runs %lld step(s), transformer_2/ %lld (CFG off)",
                      *p_.boundary_ratio(), static_cast<long long>(high), static_cast<long long>(experts.size()) - high);
      else
        std::snprintf(line, sizeof line,
                      "two experts (boundary_ratio %.3g): transformer/ runs %lld step(s) with guidance %.2f, transformer_2/ %lld with %.2f",
                      *p_.boundary_ratio(), static_cast<long long>(high), o.guidance, static_cast<long long>(experts.size()) - high,
                      o.guidance_2.value_or(o.guidance));
      lines.push_back(line);
    }
    if (p_.text_image_to_video())
      lines.push_back(
          std::string("Wan2.2 TI2V (per-token timesteps): ") +
          (o.has_image() ? "text-image-to-video, the first frame given (its latent frame fixed, at timestep 0)" : "text-to-video"));
    if (p_.image_to_video())
      lines.push_back(std::string("image-to-video: ") + (o.has_last_image() ? "first and last frame given" : "first frame given") +
                      (p_.transformer().config().has_image_branch() ? ", image tokens from the image encoder" : ""));
    return lines;
  }

  nlohmann::ordered_json report_fields(const Request& r) const override {
    nlohmann::ordered_json j = {{"frames", *r.num_frames},         {"width", *r.width}, {"height", *r.height},
                                {"steps", *r.num_inference_steps}, {"cfg", r.cfg},      {"guidance", *r.guidance_scale}};
    if (p_.transformer_2()) {
      j["guidance_2"] = r.guidance_scale_2.value_or(*r.guidance_scale);
      j["boundary_ratio"] = *p_.boundary_ratio();
    }
    if (!r.image.empty()) j["image"] = r.image;
    if (!r.last_image.empty()) j["last_image"] = r.last_image;
    j["seed"] = r.seed;
    j["scheduler"] = scheduler_name(p_.scheduler_config());
    return j;
  }

 private:
  T2VOptions options(const Request& r, const RunContext& run) const override {
    T2VOptions o;
    o.width = *r.width;
    o.height = *r.height;
    o.frames = *r.num_frames;
    o.steps = *r.num_inference_steps;
    o.guidance = *r.guidance_scale;
    o.guidance_2 = r.guidance_scale_2;
    o.cfg = cfg_mode(r);
    o.image = r.image;
    o.image_pixels = r.image_pixels;
    o.last_image = r.last_image;
    o.last_image_pixels = r.last_image_pixels;
    o.seed = r.seed;
    o.activations = run.activations;
    o.cfg_parallel = run.cfg_parallel;
    o.vae_parallel = run.vae_parallel;
    return o;
  }
};

std::unique_ptr<ModelPipeline> load_wan_meta(const std::string& model_dir, DType dtype) {
  return std::make_unique<WanModelPipeline>(WanT2VPipeline::load_meta(model_dir, dtype));
}

}  // namespace

ModelFamilyEntry wan_family() { return {"wan", "WanTransformer3DModel", &load_wan_meta}; }

}  // namespace cubevec::pipelines
