// How far an accelerated run's picture is from the exact one: PSNR and the largest absolute
// difference of two images or videos in the pipelines' [-1, 1] range (compared after diffusers'
// clamp(x / 2 + 0.5, 0, 1), i.e. as the pixels a user sees).
#pragma once

#include <vector>

#include "media/jpeg.h"
#include "tensor/tensor.h"

namespace cubevec::pipelines {

struct Quality {
  double psnr_db = 0;  // infinite when equal
  double max_abs = 0;  // in [0, 1] pixel units
};

// a and b of one shape (f32 or bf16).
Quality compare_pictures(const Tensor& a, const Tensor& b);
// The same on 8-bit pixels (an image, or a video's frames in order), as written to disk: PSNR over
// every channel of every pixel of every frame (for a video, of the whole clip).
Quality compare_pixels(const std::vector<media::RgbImage>& a, const std::vector<media::RgbImage>& b);

}  // namespace cubevec::pipelines
