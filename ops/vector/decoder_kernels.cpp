// Data-movement kernels of the decoders, written once here rather than inside model files: the
// tile blend of diffusers' tiled VAE decode, the causal convolution's frame padding, and clamping.
#include <algorithm>
#include <cstring>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "ops/vector/common.h"

namespace cubevec::ops {

namespace {

void require_f32(const Tensor& t, const char* op, const char* what) {
  if (!t.defined() || t.dtype() != DType::f32)
    throw Error(std::string(op) + ": " + what + " must be an f32 tensor, got " + (t.defined() ? t.describe() : std::string("nothing")));
}

}  // namespace

Tensor blend_tile(const Tensor& tile, const Tensor& top, const Tensor& left, int64_t blend, const Tensor& out, int64_t y0, int64_t x0,
                  int64_t keep, const Stream& stream) {
  require_f32(tile, "blend_tile", "tile");
  require_f32(out, "blend_tile", "out");
  if (tile.dim() != 4 || !tile.is_contiguous() || out.dim() != 4 || !out.is_contiguous())
    throw Error("blend_tile: tile and out must be contiguous [B, C, H, W], got " + tile.brief() + " and " + out.brief());
  const int64_t planes = tile.size(0) * tile.size(1), th = tile.size(2), tw = tile.size(3);
  const int64_t bv = top.defined() ? std::min({top.size(2), th, blend}) : 0;
  const int64_t bh = left.defined() ? std::min({left.size(3), tw, blend}) : 0;
  const int64_t top_h = top.defined() ? top.size(2) : 0, left_w = left.defined() ? left.size(3) : 0;
  const int64_t out_h = out.size(2), out_w = out.size(3);
  const int64_t keep_h = std::min(keep, th), keep_w = std::min(keep, tw);
  Tensor blended = stream.device().empty(tile.shape(), DType::f32, stream);
  std::vector<Tensor> reads = {tile};
  if (bv > 0) reads.push_back(top);
  if (bh > 0) reads.push_back(left);
  const auto p = static_cast<double>(planes);
  const double flops = 3.0 * p * static_cast<double>(bv * tw + bh * th);
  const double bytes = 4.0 * p * static_cast<double>(2 * th * tw + bv * tw + bh * th + keep_h * keep_w);
  stream.launch({"vae_tile_blend", Unit::vector, flops, bytes, DType::f32}, reads, {blended, out}, [=] {
    const auto* src = reinterpret_cast<const float*>(tile.unsynchronized_data_ptr());
    const float* above = bv > 0 ? reinterpret_cast<const float*>(top.unsynchronized_data_ptr()) : nullptr;
    const float* beside = bh > 0 ? reinterpret_cast<const float*>(left.unsynchronized_data_ptr()) : nullptr;
    auto* dst = reinterpret_cast<float*>(blended.unsynchronized_data_ptr());
    auto* image = reinterpret_cast<float*>(out.unsynchronized_data_ptr());
    const int64_t rows = planes * th;
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, tw));
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, grain), [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t row = r.begin(); row < r.end(); ++row) {
        const int64_t plane = row / th, y = row % th;
        const float* s = src + row * tw;
        float* d = dst + row * tw;
        if (y < bv) {  // the upper tile's last bv rows fade out as this tile's first bv rows fade in
          const float* a = above + (plane * top_h + top_h - bv + y) * tw;
          const auto wa = static_cast<float>(1.0 - static_cast<double>(y) / static_cast<double>(bv));
          const auto wb = static_cast<float>(static_cast<double>(y) / static_cast<double>(bv));
          for (int64_t x = 0; x < tw; ++x) d[x] = a[x] * wa + s[x] * wb;
        } else {
          std::memcpy(d, s, static_cast<std::size_t>(tw) * sizeof(float));
        }
        if (bh > 0) {  // likewise across the columns, after the vertical blend
          const float* a = beside + (plane * th + y) * left_w + left_w - bh;
          for (int64_t x = 0; x < bh; ++x) {
            const auto wa = static_cast<float>(1.0 - static_cast<double>(x) / static_cast<double>(bh));
            const auto wb = static_cast<float>(static_cast<double>(x) / static_cast<double>(bh));
            d[x] = a[x] * wa + d[x] * wb;
          }
        }
        if (y < keep_h) std::memcpy(image + (plane * out_h + y0 + y) * out_w + x0, d, static_cast<std::size_t>(keep_w) * sizeof(float));
      }
    });
  });
  return blended;
}

Tensor pad_frames_front(const Tensor& x_in, const Tensor& cache_in, int64_t zero_frames, const Stream& stream) {
  require_f32(x_in, "pad_frames_front", "x");
  if (x_in.dim() != 5 || zero_frames < 0)
    throw Error("pad_frames_front: expected a 5-D x [B, C, T, H, W] and zero_frames >= 0, got " + x_in.brief() + " and " +
                std::to_string(zero_frames));
  if (cache_in.defined()) {
    require_f32(cache_in, "pad_frames_front", "cache");
    if (cache_in.dim() != 5 || cache_in.size(0) != x_in.size(0) || cache_in.size(1) != x_in.size(1) || cache_in.size(3) != x_in.size(3) ||
        cache_in.size(4) != x_in.size(4))
      throw Error("pad_frames_front: cache " + cache_in.brief() + " does not match x " + x_in.brief() + " outside time");
  }
  const Tensor x = contiguous(x_in, stream);
  const Tensor cache = cache_in.defined() ? contiguous(cache_in, stream) : Tensor();
  const int64_t planes = x.size(0) * x.size(1), t = x.size(2), hw = x.size(3) * x.size(4);
  const int64_t tc = cache.defined() ? cache.size(2) : 0, total = zero_frames + tc + t;
  Tensor out = stream.device().empty({x.size(0), x.size(1), total, x.size(3), x.size(4)}, DType::f32, stream);
  std::vector<Tensor> reads = {x};
  if (cache.defined()) reads.push_back(cache);
  const double bytes = 4.0 * static_cast<double>(planes * hw) * static_cast<double>(total + tc + t);
  stream.launch({"pad_frames_front", Unit::vector, 0.0, bytes, DType::f32}, reads, {out},
                [x, cache, out, planes, t, hw, tc, total, zero_frames] {
                  const auto* px = reinterpret_cast<const float*>(x.unsynchronized_data_ptr());
                  const float* pc = tc > 0 ? reinterpret_cast<const float*>(cache.unsynchronized_data_ptr()) : nullptr;
                  auto* po = reinterpret_cast<float*>(out.unsynchronized_data_ptr());
                  const auto frame_bytes = static_cast<std::size_t>(hw) * sizeof(float);
                  tbb::parallel_for(tbb::blocked_range<int64_t>(0, planes), [&](const tbb::blocked_range<int64_t>& r) {
                    for (int64_t p = r.begin(); p < r.end(); ++p) {
                      float* dst = po + p * total * hw;
                      std::memset(dst, 0, static_cast<std::size_t>(zero_frames) * frame_bytes);
                      if (tc > 0) std::memcpy(dst + zero_frames * hw, pc + p * tc * hw, static_cast<std::size_t>(tc) * frame_bytes);
                      std::memcpy(dst + (zero_frames + tc) * hw, px + p * t * hw, static_cast<std::size_t>(t) * frame_bytes);
                    }
                  });
                });
  return out;
}

Tensor clamp(const Tensor& x_in, float lo, float hi, const Stream& stream) {
  require_f32(x_in, "clamp", "x");
  const Tensor x = contiguous(x_in, stream);
  Tensor out = stream.device().empty(x.shape(), DType::f32, stream);
  const int64_t n = x.numel();
  stream.launch({"clamp", Unit::vector, 2.0 * static_cast<double>(n), 8.0 * static_cast<double>(n), DType::f32}, {x}, {out},
                [x, out, n, lo, hi] {
                  const auto* src = reinterpret_cast<const float*>(x.unsynchronized_data_ptr());
                  auto* dst = reinterpret_cast<float*>(out.unsynchronized_data_ptr());
                  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 16384), [&](const tbb::blocked_range<int64_t>& r) {
                    for (int64_t i = r.begin(); i < r.end(); ++i) {
                      const float v = src[i];
                      dst[i] = v < lo ? lo : (v > hi ? hi : v);
                    }
                  });
                });
  return out;
}

}  // namespace cubevec::ops
