// upsample_nearest2d against a plain nearest-neighbour loop.
#include <gtest/gtest.h>

#include "common/tensor_testing.h"
#include "ops/vector_ops.h"

namespace cubevec {
namespace resample_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

// out[n, c, y, x] = x[n, c, y / s, x / s], as torch's F.interpolate(scale_factor=s, mode="nearest").
std::vector<double> nearest_loop(const std::vector<double>& x, int64_t planes, int64_t h, int64_t w, int64_t s) {
  std::vector<double> out;
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t y = 0; y < h * s; ++y)
      for (int64_t xo = 0; xo < w * s; ++xo) out.push_back(x[(p * h + y / s) * w + xo / s]);
  return out;
}

TEST(UpsampleNearest2d, MatchesPlainLoop) {
  struct Case {
    Shape shape;
    int64_t scale;
  };
  const Case cases[] = {{{1, 1, 1, 1}, 2},    {{2, 3, 5, 7}, 2}, {{3, 2, 1, 9}, 2}, {{2, 5, 17, 13}, 2},
                        {{1, 4, 129, 33}, 2}, {{2, 3, 5, 7}, 3}, {{1, 2, 4, 3}, 1}};
  for (const DType dtype : {DType::f32, DType::bf16})
    for (const Case& c : cases) {
      const Tensor x = random_tensor(c.shape, 7, dtype);
      const std::string what = std::string(dtype_name(dtype)) + " " + shape_to_string(c.shape) + " x" + std::to_string(c.scale);
      const Tensor y = ops::upsample_nearest2d(x, c.scale);
      ASSERT_EQ(y.shape(), (Shape{c.shape[0], c.shape[1], c.shape[2] * c.scale, c.shape[3] * c.scale})) << what;
      // A copy: exact.
      expect_close(y, nearest_loop(values(x), c.shape[0] * c.shape[1], c.shape[2], c.shape[3], c.scale), dtype, what, Tolerance{0, 0});
      // Non-contiguous input: same values.
      expect_close(ops::upsample_nearest2d(strided_copy_of(x), c.scale), values(y), dtype, what + " strided", Tolerance{0, 0});
    }
}

TEST(UpsampleNearest2d, RejectsWrongInput) {
  const std::string not_4d = message_of([] { ops::upsample_nearest2d(random_tensor({2, 3, 4}, 1)); });
  EXPECT_NE(not_4d.find("upsample_nearest2d: x must be 4-D [N, C, H, W], got f32 [2, 3, 4]"), std::string::npos) << not_4d;
  const std::string scale = message_of([] { ops::upsample_nearest2d(random_tensor({1, 1, 2, 2}, 1), 0); });
  EXPECT_NE(scale.find("scale must be a positive integer, got 0"), std::string::npos) << scale;
  const std::string dtype = message_of([] { ops::upsample_nearest2d(Tensor::zeros({1, 1, 2, 2}, DType::i32)); });
  EXPECT_NE(dtype.find("upsample_nearest2d: x must be f32 or bf16"), std::string::npos) << dtype;
}

TEST(UpsampleNearest2d, SimulateModeGivesShapeOnly) {
  Device device(builtin_cpu_profile(), {.simulate = true});
  const Tensor y = ops::upsample_nearest2d(Tensor::meta({1, 512, 128, 128}, DType::f32), 2, device.default_stream());
  EXPECT_EQ(y.shape(), (Shape{1, 512, 256, 256}));
  EXPECT_FALSE(y.has_storage());
  device.synchronize();
}

}  // namespace resample_test
}  // namespace cubevec
