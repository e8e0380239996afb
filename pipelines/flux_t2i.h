// Text-to-image with a Flux transformer and its VAE (docs/models.md "Flux latent packing",
// "FluxPipeline"): seeded noise, 2x2 packing, the FlowMatch Euler loop with Flux's dynamic shift,
// guidance embedding for
// guidance-distilled models, true CFG as one fused batch or on two overlapping streams, and the
// VAE decode (tiled for large images).
#pragma once

#include <functional>
#include <memory>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/autoencoder_kl.h"
#include "models/autoencoder_kl_encoder.h"
#include "media/jpeg.h"
#include "models/flux_transformer.h"
#include "pipelines/flow_match.h"
#include "pipelines/generation.h"
#include "pipelines/prompt_embeds_file.h"

namespace cubevec::pipelines {

struct T2IOptions {
  int64_t width = 1024, height = 1024;  // multiples of 2 x the VAE's upscale (16 for Flux)
  int steps = 28;
  double guidance = 3.5;  // embedded guidance scale (guidance-distilled models only)
  CfgMode cfg = CfgMode::off;
  // CFG parallel: the branches on the 2 ranks of this group (pipelines/guidance.h); cfg must be on.
  std::optional<parallel::Communicator> cfg_parallel;
  // Patch-parallel VAE: the ranks of this group share the tiles of a tiled decode (pipelines/patch_parallel_vae.h).
  std::optional<parallel::Communicator> vae_parallel;
  double cfg_scale = 4.0;  // true CFG: v = v_neg + cfg_scale (v - v_neg)
  uint64_t seed = 0;
  // When defined, [1, C, H/upscale, W/upscale] noise used instead of the seeded generator's (for
  // parity runs against another implementation, which cannot share our generator).
  Tensor initial_noise{};
  // The transformer's activations: f32, or bf16 (with f32 accumulation) as diffusers' bf16 run.
  DType activations = DType::f32;
  // Image-to-image (FluxImg2ImgPipeline): the picture file, resized to width x height and encoded,
  // noised to the level of the step strength starts at (pipelines/image_conditioning.h). With a mask
  // file (FluxInpaintPipeline; white: repaint), the rest is put back after every step.
  std::string image, mask;
  std::shared_ptr<const media::RgbImage> image_pixels, mask_pixels;  // instead of the files, when given
  double strength = 0.6;
  bool strength_given = false;  // a strength without a picture is a mistake, not a no-op
  bool has_image() const { return !image.empty() || image_pixels; }
  bool has_mask() const { return !mask.empty() || mask_pixels; }
  // FLUX.1 Kontext editing (FluxKontextPipeline): the picture is not a starting point but a
  // reference, encoded (the latent distribution's mean) and appended to the noise's tokens every
  // step with img_ids whose first coordinate is 1; the whole schedule runs from noise. The reference
  // is resized to kontext_reference_size() (auto_resize: Kontext's preferred resolutions); width
  // and height are already Kontext's output size (kontext_output_size, the family's defaults).
  bool edit = false;
  bool auto_resize = true;
};

class FluxT2IPipeline {
 public:
  FluxT2IPipeline(std::unique_ptr<models::FluxTransformer2DModel> transformer, std::unique_ptr<models::AutoencoderKLDecoder> vae,
                  FlowMatchConfig scheduler);

  // A diffusers model directory: transformer/, vae/, scheduler/ (scheduler_config.json; FLUX.1-dev's
  // settings when absent). The transformer's matrices are stored as `dtype`; the VAE is f32.
  // `variant` picks diffusion_pytorch_model.<variant>.safetensors (models/component.h).
  static FluxT2IPipeline load(const std::string& model_dir, DType dtype = DType::f32, const std::string& variant = "");
  // The same with shape-only weights, for simulate mode: only the config files are read (the
  // VAE is skipped when vae/config.json is absent).
  static FluxT2IPipeline load_meta(const std::string& model_dir, DType dtype = DType::f32);

  const models::FluxTransformer2DModel& transformer() const { return *transformer_; }
  models::FluxTransformer2DModel& mutable_transformer() { return *transformer_; }
  const models::AutoencoderKLDecoder* vae() const { return vae_.get(); }
  // The VAE's encoder, for image inputs: loaded with the pipeline when the VAE checkpoint has it.
  const models::AutoencoderKLEncoder* vae_encoder() const { return encoder_.get(); }
  const FlowMatchConfig& scheduler_config() const { return scheduler_; }
  // Whether the folder's model_index.json names FluxKontextPipeline: a picture is then edited.
  bool kontext() const { return kontext_; }
  // Pixels per packed latent token side: 2 x the VAE's upscale (16 for Flux; 8 without a VAE).
  int64_t size_multiple() const;
  // The image size the model is made for: the VAE config's sample_size (1024 for FLUX.1, 64 for
  // the shipped tiny model), 1024 without a VAE.
  int64_t default_image_size() const { return vae_ ? vae_->config().sample_size : 1024; }

  // Throws for options this model cannot honour (size, steps, CFG without negative embeddings...).
  void check(const T2IOptions& options, bool have_negative) const;

  // Denoises from seeded noise to packed latents [1, N_img, in_channels] (f32) on `device`, with the
  // stages' plug points in every forward (none when `stages` is null). `negative` is needed iff
  // options.cfg is not off. Throws for options the model cannot honour.
  Tensor denoise(const PromptEmbeddings& positive, const PromptEmbeddings* negative, const T2IOptions& options, Device& device,
                 const StepCallback& on_step, T2ITimings& timings, StageList* stages = nullptr) const;
  // Packed latents -> image [1, 3, H, W] (unclamped, about [-1, 1]).
  Tensor decode(const Tensor& packed, const T2IOptions& options, Device& device, T2ITimings& timings) const;

 private:
  std::unique_ptr<models::FluxTransformer2DModel> transformer_;
  std::unique_ptr<models::AutoencoderKLDecoder> vae_;
  std::unique_ptr<models::AutoencoderKLEncoder> encoder_;
  std::string encoder_error_;  // why there is no encoder
  FlowMatchConfig scheduler_;
  bool kontext_ = false;

  // The picture's latents [1, C, h, w]: (sample - shift_factor) * scaling_factor.
  Tensor image_latents(const T2IOptions& options, const Stream& stream) const;
  // Kontext's reference: the picture resized to its reference size, encoded (the mean), scaled as
  // image_latents; [1, C, h, w].
  Tensor reference_latents(const T2IOptions& options, const Stream& stream) const;
};

}  // namespace cubevec::pipelines
