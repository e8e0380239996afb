// The decoders' data-movement kernels (ops::clamp, ops::pad_frames_front, ops::blend_tile) against
// plain loops written from their definitions: copies exactly, blends within 1e-6 (f32 arithmetic).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops/vector_ops.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace decoder_kernels_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

TEST(DecoderKernels, ClampKeepsNaNAndAnyStrides) {
  Tensor x = random_tensor({3, 5, 7}, 11, DType::f32, 3.0f);
  x.mutable_data<float>()[4] = std::numeric_limits<float>::quiet_NaN();
  const Tensor strided = x.transpose(0, 2);
  const Tensor got = ops::clamp(strided, -1.0f, 0.5f);
  const std::vector<double> in = values(strided);
  std::vector<double> want(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) want[i] = std::isnan(in[i]) ? in[i] : std::min(0.5, std::max(-1.0, in[i]));
  const std::vector<double> out = values(got);
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(want[i])) EXPECT_TRUE(std::isnan(out[i])) << i;
    else EXPECT_EQ(out[i], want[i]) << i;
  }
  EXPECT_NE(message_of([&] { ops::clamp(ops::cast(x, DType::bf16), -1, 1); }).find("clamp: x must be an f32 tensor"), std::string::npos);
}

TEST(DecoderKernels, PadFramesFrontIsZerosThenCacheThenInput) {
  const Tensor x = random_tensor({2, 3, 4, 5, 6}, 1), cache = random_tensor({2, 3, 1, 5, 6}, 2);
  for (const auto& [c, zeros] : {std::pair{cache, int64_t{1}}, std::pair{Tensor(), int64_t{2}}, std::pair{cache, int64_t{0}}}) {
    const Tensor got = ops::pad_frames_front(x, c, zeros);
    const int64_t tc = c.defined() ? c.size(2) : 0;
    ASSERT_EQ(got.shape(), (Shape{2, 3, zeros + tc + 4, 5, 6}));
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t ch = 0; ch < 3; ++ch)
        for (int64_t t = 0; t < got.size(2); ++t)
          for (int64_t i = 0; i < 5; ++i)
            for (int64_t j = 0; j < 6; ++j) {
              const float v = got.at<float>({b, ch, t, i, j});
              const float want = t < zeros        ? 0.0f
                                 : t < zeros + tc ? c.at<float>({b, ch, t - zeros, i, j})
                                                  : x.at<float>({b, ch, t - zeros - tc, i, j});
              ASSERT_EQ(v, want) << b << ch << t << i << j;
            }
  }
  EXPECT_NE(message_of([&] {
              ops::pad_frames_front(x, random_tensor({2, 3, 1, 5, 7}, 3), 1);
            }).find("does not match x"),
            std::string::npos);
}

TEST(DecoderKernels, BlendTileMatchesDiffusersBlends) {
  const int64_t b = 1, c = 2, th = 6, tw = 7, blend = 3, keep = 4;
  const Tensor tile = random_tensor({b, c, th, tw}, 5), top = random_tensor({b, c, 5, tw}, 6), left = random_tensor({b, c, th, 8}, 7);
  Tensor out = Tensor::zeros({b, c, 10, 12}, DType::f32);
  const Tensor blended = ops::blend_tile(tile, top, left, blend, out, 2, 3, keep);
  // blend_v then blend_h, as diffusers' AutoencoderKL does them in place.
  std::vector<double> want = values(tile);
  auto at = [&](int64_t p, int64_t y, int64_t x) -> double& { return want[static_cast<std::size_t>((p * th + y) * tw + x)]; };
  for (int64_t p = 0; p < b * c; ++p) {
    for (int64_t y = 0; y < blend; ++y)
      for (int64_t x = 0; x < tw; ++x) {
        const double a = top.at<float>({0, p, 5 - blend + y, x});
        at(p, y, x) = a * (1.0 - static_cast<double>(y) / blend) + at(p, y, x) * (static_cast<double>(y) / blend);
      }
    for (int64_t y = 0; y < th; ++y)
      for (int64_t x = 0; x < blend; ++x) {
        const double a = left.at<float>({0, p, y, 8 - blend + x});
        at(p, y, x) = a * (1.0 - static_cast<double>(x) / blend) + at(p, y, x) * (static_cast<double>(x) / blend);
      }
  }
  expect_close(blended, want, DType::f32, "blended tile");
  for (int64_t p = 0; p < c; ++p)
    for (int64_t y = 0; y < 10; ++y)
      for (int64_t x = 0; x < 12; ++x) {
        const bool inside = y >= 2 && y < 2 + keep && x >= 3 && x < 3 + keep;
        EXPECT_NEAR(out.at<float>({0, p, y, x}), inside ? at(p, y - 2, x - 3) : 0.0, 1e-6) << p << y << x;
      }
}

}  // namespace decoder_kernels_test
}  // namespace cubevec
