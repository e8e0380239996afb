#include "ops/attention/sparse_rf_v2.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "ops/attention/problem.h"
#include "ops/gemm/driver.h"

namespace cubevec::ops::attn::rf_v2 {

namespace {

constexpr int64_t kTile = 8;

// Mean of rows [r0, r1) of x (row stride ld, d columns) into out.
void pool_rows(const float* x, int64_t ld, int64_t r0, int64_t r1, int64_t d, float* out) {
  std::fill(out, out + d, 0.0f);
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = 0; c < d; ++c) out[c] += x[r * ld + c];
  const float inv = 1.0f / static_cast<float>(r1 - r0);
  for (int64_t c = 0; c < d; ++c) out[c] *= inv;
}

// Pooled blocks of [image ; text] rows: image blocks then text blocks, each tail over its real rows.
std::vector<float> pool(const float* x, int64_t ld, int64_t image, int64_t text, int64_t d) {
  const int64_t li = ceil_div(image, kSparseBlock), lt = ceil_div(text, kSparseBlock);
  std::vector<float> out(static_cast<std::size_t>((li + lt) * d));
  for (int64_t b = 0; b < li; ++b) pool_rows(x, ld, b * kSparseBlock, std::min(image, (b + 1) * kSparseBlock), d, out.data() + b * d);
  for (int64_t b = 0; b < lt; ++b)
    pool_rows(x, ld, image + b * kSparseBlock, image + std::min(text, (b + 1) * kSparseBlock), d, out.data() + (li + b) * d);
  return out;
}

}  // namespace

std::vector<int32_t> image_token_order(const LatentShape& latent) {
  const int64_t t = latent[0], h = latent[1], w = latent[2];  // named, not bound: lambdas capture them
  const int64_t hw = h * w;
  std::vector<int32_t> order;
  order.reserve(static_cast<std::size_t>(t * hw));
  const auto raster = [&](int64_t f, int64_t y, int64_t x) { order.push_back(static_cast<int32_t>(f * hw + y * w + x)); };
  // Frame f's whole 8 x 8 tiles over rows [0, h8) and columns [0, w8), tiles and pixels row-major.
  const auto tiles = [&](int64_t f, int64_t h8, int64_t w8) {
    for (int64_t hn = 0; hn < h8 / kTile; ++hn)
      for (int64_t wn = 0; wn < w8 / kTile; ++wn)
        for (int64_t hb = 0; hb < kTile; ++hb)
          for (int64_t wb = 0; wb < kTile; ++wb) raster(f, hn * kTile + hb, wn * kTile + wb);
  };
  if (h % kTile == 0 && w % kTile == 0) {
    for (int64_t f = 0; f < t; ++f) tiles(f, h, w);
    return order;
  }
  const int64_t h8 = h - h % kTile, w8 = w - w % kTile;
  for (int64_t i = 0; i < hw; ++i) order.push_back(static_cast<int32_t>(i));  // frame 0 as it is
  for (int64_t f = 1; f < t; ++f) {
    tiles(f, h8, w8);
    for (int64_t y = h8; y < h; ++y)
      for (int64_t x = 0; x < w; ++x) raster(f, y, x);  // the bottom rows, whole
    for (int64_t y = 0; y < h8; ++y)
      for (int64_t x = w8; x < w; ++x) raster(f, y, x);  // the right columns of the other rows
  }
  return order;
}

std::vector<int32_t> sequence_order(const LatentShape& latent, int64_t txt_len) {
  std::vector<int32_t> order = image_token_order(latent);
  for (int32_t& i : order) i += static_cast<int32_t>(txt_len);
  for (int64_t i = 0; i < txt_len; ++i) order.push_back(static_cast<int32_t>(i));
  return order;
}

int64_t pooled_blocks(int64_t image, int64_t text) { return ceil_div(image, kSparseBlock) + ceil_div(text, kSparseBlock); }

void head_mask(const HeadInput& in, uint8_t* mask, float* scores) {
  const int64_t l = pooled_blocks(in.image, in.text), d = in.d;
  const std::vector<float> qp = pool(in.q, in.ld, in.image, in.text, d), kp = pool(in.k, in.ld, in.image, in.text, d);
  // scores = qp kp^T, then the scaled softmax per row.
  gemm::Problem p;
  p.m = p.n = l;
  p.k = d;
  p.a = qp.data();
  p.lda = d;
  p.b = kp.data();
  p.ldb = d;
  p.trans_b = true;
  p.c = scores;
  p.ldc = l;
  gemm::sgemm(p, gemm::best_isa(), 1);
  // Python's float arithmetic: ceil(L * (1 - sparsity)), e.g. L = 10, 0.7 keeps 4.
  const auto keep = static_cast<int64_t>(std::ceil(static_cast<double>(l) * (1.0 - in.sparsity)));
  std::vector<float> sorted(static_cast<std::size_t>(l));
  for (int64_t i = 0; i < l; ++i) {
    float* row = scores + i * l;
    float mx = -INFINITY;
    for (int64_t j = 0; j < l; ++j) mx = std::max(mx, row[j] * in.scale);
    float sum = 0;
    for (int64_t j = 0; j < l; ++j) sum += row[j] = std::exp(row[j] * in.scale - mx);
    for (int64_t j = 0; j < l; ++j) row[j] /= sum;
    std::copy(row, row + l, sorted.begin());
    std::nth_element(sorted.begin(), sorted.begin() + (keep - 1), sorted.end(), std::greater<float>());
    const float threshold = sorted[static_cast<std::size_t>(keep - 1)];
    for (int64_t j = 0; j < l; ++j) mask[i * l + j] = row[j] >= threshold ? 1 : 0;
  }
  // Text blocks (the last ones) and first-frame blocks (the first ones), rows and columns.
  const int64_t text_blocks = ceil_div(in.text, kSparseBlock), frame_blocks = std::min(l, ceil_div(in.first_frame, kSparseBlock));
  for (int64_t i = 0; i < l; ++i)
    for (int64_t j = 0; j < l; ++j)
      if (i >= l - text_blocks || j >= l - text_blocks || i < frame_blocks || j < frame_blocks) mask[i * l + j] = 1;
}

double expected_density(const LatentShape& latent, int64_t txt_len, double sparsity) {
  const int64_t image = latent[0] * latent[1] * latent[2];
  const int64_t l = pooled_blocks(image, txt_len), lk = ceil_div(image + txt_len, kSparseBlock);
  const auto keep = static_cast<double>(std::ceil(static_cast<double>(l) * (1.0 - sparsity)));
  const int64_t forced = std::min(l, ceil_div(txt_len, kSparseBlock) + ceil_div(latent[1] * latent[2], kSparseBlock));
  // Over the kernel's lk rows and columns: forced rows whole; each other row its top-k and the
  // forced columns, overlapping as if independent.
  const double f = static_cast<double>(std::min(forced, lk)), n = static_cast<double>(lk);
  const double other_row = std::min(n, keep + f - keep * f / static_cast<double>(l));
  return (f * n + (n - f) * other_row) / (n * n);
}

}  // namespace cubevec::ops::attn::rf_v2
