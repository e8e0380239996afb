// rotary_position_embedding: every layout (BSND, BNSD, SBND) x rotated mode x cos/sin form
// ([S, D] and the layout's 4-D broadcast shape) x dtype, against the pair formula
// (rotated_interleaved) and the halves formula (rotated_half) written here in double, with
// contiguous and strided x, and the shape errors. Tolerances: f32 1e-5 relative + 1e-6;
// bf16 (reference from the bf16-rounded inputs) 2^-8 relative + 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "ops/vector_ops.h"
#include "tensor/half.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace rope_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

using ops::RopeLayout;
using ops::RotatedMode;

const char* layout_name(RopeLayout l) { return l == RopeLayout::BSND ? "BSND" : l == RopeLayout::BNSD ? "BNSD" : "SBND"; }

// The shape of x for (b, s, n, d) in `layout`, and the position s of a flat row index there.
Shape x_shape(RopeLayout l, int64_t b, int64_t s, int64_t n, int64_t d) {
  if (l == RopeLayout::BSND) return {b, s, n, d};
  if (l == RopeLayout::BNSD) return {b, n, s, d};
  return {s, b, n, d};
}

int64_t position_of_row(RopeLayout l, int64_t row, int64_t b, int64_t s, int64_t n) {
  if (l == RopeLayout::BSND) return row / n % s;
  if (l == RopeLayout::BNSD) return row % s;
  return row / (b * n);
}

Shape cos_4d(RopeLayout l, int64_t s, int64_t d) {
  if (l == RopeLayout::BSND) return {1, s, 1, d};
  if (l == RopeLayout::BNSD) return {1, 1, s, d};
  return {s, 1, 1, d};
}

std::vector<double> reference(RopeLayout layout, RotatedMode mode, const std::vector<double>& x, const std::vector<double>& c,
                              const std::vector<double>& sn, int64_t b, int64_t s, int64_t n, int64_t d) {
  std::vector<double> out(x.size());
  const int64_t rows = static_cast<int64_t>(x.size()) / d, half = d / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = position_of_row(layout, r, b, s, n);
    const double* xr = &x[static_cast<std::size_t>(r * d)];
    const double* cr = &c[static_cast<std::size_t>(p * d)];
    const double* sr = &sn[static_cast<std::size_t>(p * d)];
    double* o = &out[static_cast<std::size_t>(r * d)];
    if (mode == RotatedMode::rotated_interleaved) {
      for (int64_t i = 0; i < half; ++i) {  // pairs (x_2i, x_2i+1): rot = (-x_2i+1, x_2i)
        o[2 * i] = xr[2 * i] * cr[2 * i] - xr[2 * i + 1] * sr[2 * i];
        o[2 * i + 1] = xr[2 * i + 1] * cr[2 * i + 1] + xr[2 * i] * sr[2 * i + 1];
      }
    } else {
      for (int64_t i = 0; i < half; ++i) {  // halves [x1 | x2]: rot = [-x2 | x1]
        o[i] = xr[i] * cr[i] - xr[i + half] * sr[i];
        o[i + half] = xr[i + half] * cr[i + half] + xr[i] * sr[i + half];
      }
    }
  }
  return out;
}

TEST(Rope, EveryLayoutModeAndCosSinForm) {
  const int64_t b = 2, s = 3, n = 5;
  for (RopeLayout layout : {RopeLayout::BSND, RopeLayout::BNSD, RopeLayout::SBND})
    for (RotatedMode mode : {RotatedMode::rotated_half, RotatedMode::rotated_interleaved})
      for (DType dtype : {DType::f32, DType::bf16})
        for (DType cs_type : {DType::f32, DType::bf16})
          for (int64_t d : {2, 14, 34, 130})
            for (bool four_d : {false, true}) {
              const Tensor x = random_tensor(x_shape(layout, b, s, n, d), 1, dtype);
              const Shape cs_shape = four_d ? cos_4d(layout, s, d) : Shape{s, d};
              const Tensor c = random_tensor(cs_shape, 2, cs_type, 1.0f), sn = random_tensor(cs_shape, 3, cs_type, 1.0f);
              const std::vector<double> want = reference(layout, mode, values(x), values(c), values(sn), b, s, n, d);
              const std::string what = std::string(layout_name(layout)) + (mode == RotatedMode::rotated_half ? " half " : " interleaved ") +
                                       std::string(dtype_name(dtype)) + " cos " + std::string(dtype_name(cs_type)) +
                                       " d=" + std::to_string(d) + (four_d ? " 4-D" : " 2-D");
              const Tensor y = ops::rotary_position_embedding(x, c, sn, mode, layout);
              EXPECT_EQ(y.shape(), x.shape()) << what;
              expect_close(y, want, dtype, what);
            }
}

TEST(Rope, StridedInputsAndMixedCosSinDTypes) {
  const int64_t b = 2, s = 7, n = 3, d = 18;
  // x in BSND as a permuted view of a BNSD tensor; cos as a transposed view; sin in the other dtype.
  const Tensor x = random_tensor({b, n, s, d}, 4).permute({0, 2, 1, 3});
  ASSERT_FALSE(x.is_contiguous());
  const Tensor c = random_tensor({d, s}, 5, DType::f32, 1.0f).transpose(0, 1);
  const Tensor sn = random_tensor({s, d}, 6, DType::bf16, 1.0f);
  for (RotatedMode mode : {RotatedMode::rotated_half, RotatedMode::rotated_interleaved}) {
    const std::vector<double> want = reference(RopeLayout::BSND, mode, values(x), values(c), values(sn), b, s, n, d);
    expect_close(ops::rotary_position_embedding(x, c, sn, mode, RopeLayout::BSND), want, DType::f32, "strided");
  }
}

TEST(Rope, ParsesRotatedModeNames) {
  EXPECT_EQ(ops::parse_rotated_mode("rotated_half"), RotatedMode::rotated_half);
  EXPECT_EQ(ops::parse_rotated_mode("rotated_interleaved"), RotatedMode::rotated_interleaved);
  const std::string msg = message_of([] { ops::parse_rotated_mode("half"); });
  EXPECT_NE(msg.find("unknown rotated_mode 'half' (expected one of: rotated_half, rotated_interleaved)"), std::string::npos) << msg;
}

TEST(Rope, ErrorsNameWhatWasExpected) {
  const Tensor x = random_tensor({1, 3, 2, 8}, 7);
  const Tensor c = random_tensor({3, 8}, 8), sn = random_tensor({3, 8}, 9);
  std::string msg = message_of([&] {
    ops::rotary_position_embedding(random_tensor({1, 3, 2, 7}, 1), random_tensor({3, 7}, 2), random_tensor({3, 7}, 3));
  });
  EXPECT_NE(msg.find("rotary_position_embedding: the head dim D = 7 of x [1, 3, 2, 7] must be even"), std::string::npos) << msg;
  msg = message_of([&] { ops::rotary_position_embedding(x, random_tensor({4, 8}, 2), sn); });
  EXPECT_NE(msg.find("rotary_position_embedding: cos must have shape [S, D] = [3, 8] or [1, 3, 1, 8] for x "
                     "[1, 3, 2, 8] in layout BSND, got [4, 8]"),
            std::string::npos)
      << msg;
  msg = message_of([&] {
    ops::rotary_position_embedding(x, c, random_tensor({1, 1, 3, 8}, 2), RotatedMode::rotated_half, RopeLayout::BSND);
  });
  EXPECT_NE(msg.find("sin must have shape [S, D] = [3, 8] or [1, 3, 1, 8]"), std::string::npos) << msg;
  msg = message_of([&] { ops::rotary_position_embedding(x.select(0, 0), c, sn); });
  EXPECT_NE(msg.find("rotary_position_embedding: x must be 4-D in layout BSND, got f32 [3, 2, 8]"), std::string::npos) << msg;
  msg = message_of([&] { ops::rotary_position_embedding(x, Tensor::zeros({3, 8}, DType::i32), sn); });
  EXPECT_NE(msg.find("rotary_position_embedding: cos must be f32 or bf16, got i32 [3, 8]"), std::string::npos) << msg;
}

}  // namespace rope_test
}  // namespace cubevec
