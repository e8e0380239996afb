// RMSNorm over channels that several ranks share (tensor parallelism): each rank sums the squares of
// its channels, the sums are all-reduced elsewhere, and each rank normalizes its channels by the
// total. Plain loops: these norms are a few per block on rows the attention dwarfs.
#include <cmath>

#include "ops/vector/common.h"

namespace cubevec::ops {

namespace {

int64_t width_of(const Tensor& x, const char* op) {
  if (x.dim() == 0) throw Error(std::string(op) + ": x must have at least one dimension, got a scalar");
  return x.size(-1);
}

}  // namespace

Tensor row_sum_of_squares(const Tensor& x, const Stream& stream) {
  constexpr const char* op = "row_sum_of_squares";
  detail::float_elem(x, op, "x");
  const int64_t width = width_of(x, op);
  const Tensor xc = detail::contiguous_on(x, stream);
  Shape shape = x.shape();
  shape.pop_back();
  Tensor sums = stream.device().empty(shape, DType::f32, stream);
  const int64_t rows = width == 0 ? 0 : x.numel() / width;
  stream.launch(
      {op, Unit::vector, 2.0 * static_cast<double>(x.numel()), detail::bytes_of(xc) + 4.0 * static_cast<double>(rows), DType::f32}, {xc},
      {sums}, [=] {
        const void* in = detail::in_ptr(xc);
        float* out = reinterpret_cast<float*>(detail::out_ptr(sums));
        detail::parallel_chunks(rows, width, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            float sum = 0.0f;
            for (int64_t c = 0; c < width; ++c) {
              const float v = detail::load_float(in, xc.dtype(), r * width + c);
              sum += v * v;
            }
            out[r] = sum;
          }
        });
      });
  return sums;
}

Tensor rms_norm_with_sums(const Tensor& x, const Tensor& sums, int64_t count, const Tensor& weight, float eps, const Stream& stream) {
  constexpr const char* op = "rms_norm_with_sums";
  detail::float_elem(x, op, "x");
  const int64_t width = width_of(x, op);
  Shape rows_shape = x.shape();
  rows_shape.pop_back();
  if (!sums.defined() || sums.dtype() != DType::f32 || sums.shape() != rows_shape)
    throw Error(std::string(op) + ": sums must be f32 " + shape_to_string(rows_shape) + " (one per row of x " + shape_to_string(x.shape()) +
                "), got " + sums.brief());
  if (count < width)
    throw Error(std::string(op) + ": count must be at least the row width " + std::to_string(width) + ", got " + std::to_string(count));
  if (!(eps > 0)) throw Error(std::string(op) + ": eps must be positive, got " + std::to_string(eps));
  const Tensor w = detail::f32_param(weight, {width}, "[" + std::to_string(width) + "], the last size of x", op, "weight", stream);
  const Tensor xc = detail::contiguous_on(x, stream), sc = detail::contiguous_on(sums, stream);
  Tensor out = stream.device().empty(x.shape(), x.dtype(), stream);
  const int64_t rows = width == 0 ? 0 : x.numel() / width;
  std::vector<Tensor> reads{xc, sc};
  if (w.defined()) reads.push_back(w);
  stream.launch({op, Unit::vector, 2.0 * static_cast<double>(x.numel()), 2.0 * detail::bytes_of(xc) + detail::bytes_of(sc), DType::f32},
                reads, {out}, [=] {
                  const void* in = detail::in_ptr(xc);
                  const float* s = detail::f32_ptr(sc);
                  const float* wp = detail::f32_ptr(w);
                  void* o = detail::out_ptr(out);
                  detail::parallel_chunks(rows, width, [&](int64_t r0, int64_t r1) {
                    for (int64_t r = r0; r < r1; ++r) {
                      const float inv = 1.0f / std::sqrt(s[r] / static_cast<float>(count) + eps);
                      for (int64_t c = 0; c < width; ++c) {
                        detail::store_float(o, xc.dtype(), r * width + c,
                                            (wp ? wp[c] : 1.0f) * (detail::load_float(in, xc.dtype(), r * width + c) * inv));
                      }
                    }
                  });
                });
  return out;
}

}  // namespace cubevec::ops
