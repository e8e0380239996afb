// Nearest-neighbour upsampling by an integer factor (the VAE decoder's Upsample2D).
#include <cstring>

#include "ops/vector/common.h"

namespace cubevec::ops {

namespace {

// Writes the `scale` output rows of each input row r in [r0, r1) of x [rows, w] into out
// [rows * scale, w * scale]: every value repeated `scale` times along the row, and the row
// repeated `scale` times.
template <class T>
void upsample_rows(const T* x, T* out, int64_t w, int64_t scale, int64_t r0, int64_t r1) {
  const int64_t wo = w * scale;
  for (int64_t r = r0; r < r1; ++r) {
    const T* src = x + r * w;
    T* first = out + r * scale * wo;
    if (scale == 2) {
      for (int64_t j = 0; j < w; ++j) first[2 * j] = first[2 * j + 1] = src[j];
    } else {
      for (int64_t j = 0; j < w; ++j)
        for (int64_t s = 0; s < scale; ++s) first[j * scale + s] = src[j];
    }
    for (int64_t s = 1; s < scale; ++s) std::memcpy(first + s * wo, first, static_cast<std::size_t>(wo) * sizeof(T));
  }
}

}  // namespace

Tensor upsample_nearest2d(const Tensor& x, int64_t scale, const Stream& stream) {
  constexpr const char* op = "upsample_nearest2d";
  const vk::Elem type = detail::float_elem(x, op, "x");
  if (x.dim() != 4) throw Error("upsample_nearest2d: x must be 4-D [N, C, H, W], got " + x.brief());
  if (scale < 1) throw Error("upsample_nearest2d: scale must be a positive integer, got " + std::to_string(scale));
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const Tensor xc = detail::contiguous_on(x, stream);
  Tensor out = stream.device().empty({n, c, h * scale, w * scale}, x.dtype(), stream);
  const int64_t rows = n * c * h;  // input rows; each becomes `scale` output rows
  const double bytes = detail::bytes_of(xc) + detail::bytes_of(out);
  stream.launch({op, Unit::vector, 0.0, bytes, DType::f32}, {xc}, {out}, [xc, out, type, rows, w, scale] {
    if (rows == 0 || w == 0) return;
    const void* src = detail::in_ptr(xc);
    void* dst = detail::out_ptr(out);
    detail::parallel_chunks(rows, w * scale * scale, [&](int64_t r0, int64_t r1) {
      if (type == vk::Elem::f32) upsample_rows(static_cast<const float*>(src), static_cast<float*>(dst), w, scale, r0, r1);
      else upsample_rows(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), w, scale, r0, r1);
    });
  });
  return out;
}

}  // namespace cubevec::ops
