// The Wan family (text to video, WanTransformer3DModel) behind the library's ModelPipeline: its
// defaults (the folder's generation_defaults.json, else Wan2.1's 832x480, 81 frames, 50 steps,
// CFG 5 fused), its text conditioning (umT5), its checks, memory estimate and report.
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
  if (pipeline.vae()) e.weights += stored_bytes(pipeline.vae()->parameters(), DType::f32);
  // A Wan block holds, per video token, the residual stream and its norm (2 D), q, k, v and the
  // self-attention output (4 D), the cross-attention query and output (2 D), and the FFN hidden
  // before and after its activation (2 ffn_dim): 8 D + 2 F. The kernels launched ahead of the
  // device pin about as much again: measured 2.1x that on the tiny model, so 24 D + 4 F.
  const uint64_t tokens =
      static_cast<uint64_t>((o.latent_frames() / c.patch_size[0]) * (o.height / 8 / c.patch_size[1]) * (o.width / 8 / c.patch_size[2]));
  const uint64_t per_token = 24 * static_cast<uint64_t>(c.inner_dim()) + 4 * static_cast<uint64_t>(c.ffn_dim);
  const uint64_t text = static_cast<uint64_t>(text_tokens) * 2 * static_cast<uint64_t>(c.inner_dim());  // cross-attention k, v
  const uint64_t rope = tokens * static_cast<uint64_t>(c.attention_head_dim) * 2 * 4;
  e.denoising = static_cast<uint64_t>(batch) * (tokens * per_token + text) * activation_bytes(o.activations) + rope + kWorkspaceBytes;
  if (pipeline.vae()) e.vae_decode = static_cast<uint64_t>(pipeline.vae()->estimate_peak_bytes(1, o.height / 8, o.width / 8));
  return e;
}

class WanModelPipeline : public FamilyPipelineBase<WanT2VPipeline, T2VOptions> {
 public:
  using FamilyPipelineBase::FamilyPipelineBase;

  std::string family() const override { return "wan"; }
  std::string task() const override { return "t2v"; }
  bool video() const override { return true; }

  // The settings the request leaves out, from the folder's generation_defaults.json (the shipped
  // tinywan's 64x64 x 17 frames instead of Wan2.1's 832x480 x 81), else Wan2.1's.
  Request with_defaults(const Request& request, const std::string& model_dir, std::vector<std::string>& from_defaults) const override {
    const GenerationDefaults d = GenerationDefaults::load(model_dir);
    const T2VOptions wan21;
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
    take("--width", d.width, r.width, wan21.width);
    take("--height", d.height, r.height, wan21.height);
    take("--frames", d.frames, r.num_frames, wan21.frames);
    take("--steps", d.steps, r.num_inference_steps, wan21.steps);
    take("--guidance", d.guidance, r.guidance_scale, wan21.guidance);
    if (r.cfg.empty()) r.cfg = std::string(cfg_mode_name(wan21.cfg));
    return r;
  }

  CfgMode cfg_mode(const Request& request) const override { return request.cfg.empty() ? CfgMode::fused : parse_cfg_mode(request.cfg); }
  TextInput text_input() const override { return TextInput::of(p_.transformer().config()); }

  TextConditioning one_shot_text(const std::string& model_dir, const Request& request, const TextSettings& settings, bool simulate,
                                 const Stream& stream) const override {
    return wan_text(model_dir, request.text, settings, cfg_mode(request) != CfgMode::off, simulate, p_.transformer().config(), stream);
  }

  void check(const Request& request, const RunContext& run, bool have_negative) const override {
    if (request.true_cfg_scale) throw Error("--cfg-scale is Flux's true CFG scale; Wan's CFG scale is --guidance");
    const char* flag = request.has_image()   ? "--image"
                       : request.has_mask()  ? "--mask"
                       : request.strength    ? "--strength"
                       : request.edit        ? "--edit"
                       : request.max_area    ? "--max-area"
                       : request.auto_resize ? "--no-auto-resize"
                                             : nullptr;
    if (flag)
      throw Error(std::string(flag) +
                  " is for Flux pictures (image-to-image, inpainting, Kontext editing); this Wan2.1 model makes video from text only");
    p_.check(options(request, run), have_negative);
    if (run.vae_parallel) check_row_split(run.vae_parallel->size(), *request.height / 8);
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
                  static_cast<long long>(o.latent_frames()), static_cast<long long>(o.height / 8), static_cast<long long>(o.width / 8),
                  o.steps, r.cfg.c_str(), o.guidance, static_cast<long long>(mc.num_layers), static_cast<long long>(mc.inner_dim()),
                  dtype.c_str(), profile.name.c_str(), profile.cube_threads, profile.vector_threads,
                  simulate ? ", SIMULATED (modelled times)" : "");
    return {"scheduler: " + scheduler_name(p_.scheduler_config()), line};
  }

  nlohmann::ordered_json report_fields(const Request& r) const override {
    return {{"frames", *r.num_frames},
            {"width", *r.width},
            {"height", *r.height},
            {"steps", *r.num_inference_steps},
            {"cfg", r.cfg},
            {"guidance", *r.guidance_scale},
            {"seed", r.seed},
            {"scheduler", scheduler_name(p_.scheduler_config())}};
  }

 private:
  T2VOptions options(const Request& r, const RunContext& run) const override {
    T2VOptions o;
    o.width = *r.width;
    o.height = *r.height;
    o.frames = *r.num_frames;
    o.steps = *r.num_inference_steps;
    o.guidance = *r.guidance_scale;
    o.cfg = cfg_mode(r);
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
