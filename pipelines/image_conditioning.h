// What Flux's image-to-image and inpainting add to text-to-image (diffusers' FluxImg2ImgPipeline
// and FluxInpaintPipeline; docs/models.md, "Images in"): the schedule cut by strength, the picture's
// latents noised to the first step's level, and the inpainting mask at latent resolution.
#pragma once

#include <cstdint>

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

}  // namespace cubevec::pipelines
