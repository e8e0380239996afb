// How far an accelerated run's picture is from the exact one: PSNR and the largest absolute
// difference of two images or videos in the pipelines' [-1, 1] range (compared after diffusers'
// clamp(x / 2 + 0.5, 0, 1), i.e. as the pixels a user sees).
#pragma once

#include "tensor/tensor.h"

namespace cubevec::pipelines {

struct Quality {
  double psnr_db = 0;  // infinite when equal
  double max_abs = 0;  // in [0, 1] pixel units
};

// a and b of one shape (f32 or bf16).
Quality compare_pictures(const Tensor& a, const Tensor& b);

}  // namespace cubevec::pipelines
