// What Flux's image-to-image, inpainting and Kontext editing add to text-to-image (diffusers'
// FluxImg2ImgPipeline, FluxInpaintPipeline and FluxKontextPipeline; docs/models.md, "Images in"):
// the schedule cut by strength, the picture's latents noised to the first step's level, the
// inpainting mask at latent resolution, and Kontext's sizes and reference-token ids.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "media/jpeg.h"
#include "tensor/tensor.h"

namespace cubevec::pipelines {

// diffusers' get_timesteps: init = min(steps * strength, steps), the schedule starts at index
// int(max(steps - init, 0)). Throws naming --strength for a strength outside (0, 1] (0 would run no
// step: the picture would come back as it went in).
int img2img_start_step(int steps, double strength);

// The FlowMatch scheduler's scale_noise: sigma * noise + (1 - sigma) * latents, elementwise (f32).
Tensor scale_noise(const Tensor& latents, const Tensor& noise, float sigma);

// The seed of the encoder's latent sample (latent_dist.sample): a stream of its own, so the
// initial noise is the text-to-image run's for the same seed (strength 1 gives its picture).
uint64_t encode_sample_seed(uint64_t seed);

// PIL's convert("L") of an RGB picture: (19595 R + 38470 G + 7471 B + 2^15) >> 16.
media::RgbImage to_grey(const media::RgbImage& image);

// FluxInpaintPipeline's mask: grey, resized to width x height (Lanczos), scaled to [0, 1],
// binarized at 0.5 (1: repaint), then nearest-resized to the latent's h x w: [1, 1, h, w] f32.
Tensor inpaint_mask(const media::RgbImage& mask, int64_t width, int64_t height, int64_t latent_h, int64_t latent_w);

// FluxKontextPipeline's output size: (width, height) scaled to `max_area` pixels at its aspect ratio,
// each side rounded as Python's round() (ties to even), then floored to `multiple` (2 x the VAE's
// upscale: 16 for FLUX.1). Returns {width, height}; an error naming --max-area when a side would be 0.
std::pair<int64_t, int64_t> kontext_output_size(int64_t width, int64_t height, int64_t max_area, int64_t multiple);

// The reference picture's size: the picture's own floored to `vae_scale_factor` (VaeImageProcessor's
// get_default_height_width); with `auto_resize`, the entry of Kontext's preferred resolutions (672 x
// 1568 ... 1568 x 672) nearest its aspect ratio instead; floored to `multiple`. Returns {width, height}.
std::pair<int64_t, int64_t> kontext_reference_size(int64_t image_width, int64_t image_height, bool auto_resize, int64_t vae_scale_factor,
                                                   int64_t multiple);

// The most pixels a Kontext reference may have beside a width x height output: 4x the output's, or
// Kontext's largest preferred resolution if that is more (the check and the memory estimate).
int64_t kontext_reference_pixel_limit(int64_t width, int64_t height);

// The reference tokens' img_ids: Flux's (0, row, col) grid of the reference's packed latent with the
// first coordinate 1 ("image ids are the same as latent ids with the first dimension set to 1").
Tensor kontext_reference_ids(int64_t latent_height, int64_t latent_width);

// Whether `model_dir`/model_index.json names FluxKontextPipeline (an unreadable or malformed file is
// an error naming it; no file: false).
bool names_kontext_pipeline(const std::string& model_dir);

}  // namespace cubevec::pipelines
