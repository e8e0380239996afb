// RainFusion 2.0's pieces (ops/sparse_attention.h), on plain arrays so tests can check each:
// the token order, the pooled blocks, one head's block mask, and the kept fraction the cost model
// expects.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/sparse_attention.h"

namespace cubevec::ops::attn::rf_v2 {

// MindIE's rearrange_with_remaining on the t * h * w image tokens: position i of the result holds
// raster token order[i]. 8 x 8 tiles per frame, tiles and their pixels row-major; when h or w is
// not a multiple of 8, frame 0 stays raster and each later frame is [its whole tiles | the bottom
// h % 8 rows (raster) | the right w % 8 columns of the other rows (raster)].
std::vector<int32_t> image_token_order(const LatentShape& latent);

// The kernel's sequence [reordered image; text] as source positions in the input [text; image].
std::vector<int32_t> sequence_order(const LatentShape& latent, int64_t txt_len);

// Pooled blocks: ceil(image / 128) + ceil(text / 128) (image and text pooled separately).
int64_t pooled_blocks(int64_t image, int64_t text);

struct HeadInput {
  const float* q = nullptr;  // the reordered sequence's rows [image' ; text], row stride ld
  const float* k = nullptr;
  int64_t ld = 0, image = 0, text = 0, d = 0;
  int64_t first_frame = 0;  // h * w
  float scale = 1.0f;
  double sparsity = 0.0;
};
// One head's block mask M [L, L] (L = pooled_blocks): softmax(pool(q) pool(k)^T * scale) per row,
// kept where >= the row's ceil(L * (1 - sparsity))-th largest, then the text blocks (the last
// ceil(text / 128)) and the first-frame blocks (the first ceil(h * w / 128)) kept as whole rows
// and columns. `scores` is scratch of L * L floats.
void head_mask(const HeadInput& in, uint8_t* mask, float* scores);

// The kept fraction of the kernel's Lk x Lk blocks that head_mask gives without ties: forced rows
// whole, other rows their top-k united with the forced columns (taken as independent).
double expected_density(const LatentShape& latent, int64_t txt_len, double sparsity);

}  // namespace cubevec::ops::attn::rf_v2
