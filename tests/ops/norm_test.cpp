// RMSNorm, fast_layernorm, layernorm_scale_shift (AdaLN), GroupNorm and normalize_channels against
// double-precision loops written here, on odd widths, f32 and bf16 (with f32 or bf16 parameters), contiguous and
// strided x, and the shape/dtype errors. Tolerances: f32 |got - want| <= 1e-5 |want| + 1e-5;
// bf16 (reference from the bf16-rounded inputs) <= 2^-8 |want| + 1e-5 (about one bf16 ulp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>

#include "ops/vector/kernels.h"
#include "ops/vector_ops.h"
#include "tensor/half.h"

#include "common/tensor_testing.h"

namespace cubevec {
namespace norm_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

// Norms allow 1e-5 absolute in every dtype: outputs are O(1) and each sums a whole row.
void expect_norm_close(const Tensor& got, const std::vector<double>& want, DType dtype, const std::string& what) {
  expect_close(got, want, dtype, what, Tolerance{default_tolerance(dtype).rtol, 1e-5});
}

constexpr int64_t kWidths[] = {1, 7, 17, 129};
constexpr DType kDTypes[] = {DType::f32, DType::bf16};

// Mean and 1/sqrt(var + eps) of each row of `width` values (two-pass, double).
void row_stats(const std::vector<double>& x, int64_t width, double eps, std::vector<double>& mean, std::vector<double>& rstd) {
  const int64_t rows = static_cast<int64_t>(x.size()) / width;
  mean.assign(static_cast<std::size_t>(rows), 0);
  rstd.assign(static_cast<std::size_t>(rows), 0);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < width; ++i) m += x[r * width + i];
    m /= static_cast<double>(width);
    for (int64_t i = 0; i < width; ++i) v += (x[r * width + i] - m) * (x[r * width + i] - m);
    mean[r] = m;
    rstd[r] = 1 / std::sqrt(v / static_cast<double>(width) + eps);
  }
}

// The channels cut in two uneven parts, as two tensor-parallel ranks hold them: the sums of squares of
// both parts added, each part normalized by the total, side by side equal the double-loop RMSNorm of
// the whole row.
TEST(Norm, RmsNormWithSumsOverSharedChannelsMatchesDefinition) {
  for (DType dtype : kDTypes)
    for (int64_t h : {2, 17, 130}) {
      const Tensor x = random_tensor({3, 5, h}, 11, dtype), w = random_tensor({h}, 12);
      const std::vector<double> xv = values(x), wv = values(w);
      std::vector<double> want(xv.size());
      for (int64_t r = 0; r < 15; ++r) {
        double ms = 0;
        for (int64_t i = 0; i < h; ++i) ms += xv[r * h + i] * xv[r * h + i];
        for (int64_t i = 0; i < h; ++i) want[r * h + i] = xv[r * h + i] / std::sqrt(ms / double(h) + 1e-6) * wv[i];
      }
      const int64_t cut = h / 3 + 1;
      const Tensor a = x.narrow(2, 0, cut), b = x.narrow(2, cut, h - cut);
      const Tensor total = ops::add(ops::row_sum_of_squares(a), ops::row_sum_of_squares(b));
      const Tensor got = ops::concat({ops::rms_norm_with_sums(a, total, h, w.narrow(0, 0, cut).contiguous(), 1e-6f),
                                      ops::rms_norm_with_sums(b, total, h, w.narrow(0, cut, h - cut).contiguous(), 1e-6f)},
                                     2);
      expect_norm_close(got, want, dtype, std::string(dtype_name(dtype)) + " h=" + std::to_string(h));
    }
  const Tensor x = random_tensor({2, 4}, 13);
  EXPECT_NE(message_of([&] {
              ops::rms_norm_with_sums(x, random_tensor({3}, 14), 8, {}, 1e-6f);
            }).find("rms_norm_with_sums: sums must be f32 [2] (one per row of x [2, 4]), got f32 [3]"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              ops::rms_norm_with_sums(x, ops::row_sum_of_squares(x), 3, {}, 1e-6f);
            }).find("count must be at least the row width 4, got 3"),
            std::string::npos);
}

TEST(Norm, RmsNormMatchesDefinition) {
  for (DType dtype : kDTypes)
    for (int64_t h : kWidths)
      for (DType wtype : kDTypes) {
        const Tensor x = random_tensor({3, 5, h}, 1, dtype), w = random_tensor({h}, 2, wtype);
        const std::vector<double> xv = values(x), wv = values(w);
        std::vector<double> want(xv.size()), want_plain(xv.size());
        for (int64_t r = 0; r < 15; ++r) {
          double ms = 0;
          for (int64_t i = 0; i < h; ++i) ms += xv[r * h + i] * xv[r * h + i];
          ms /= static_cast<double>(h);
          for (int64_t i = 0; i < h; ++i) {
            want[r * h + i] = xv[r * h + i] / std::sqrt(ms + 1e-6) * wv[i];
            want_plain[r * h + i] = xv[r * h + i] / std::sqrt(ms + 1e-5);
          }
        }
        const std::string what = std::string(dtype_name(dtype)) + " weight " + std::string(dtype_name(wtype)) + " h=" + std::to_string(h);
        expect_norm_close(ops::rms_norm(x, w, 1e-6f), want, dtype, what);
        expect_norm_close(ops::rms_norm(x, Tensor(), 1e-5f), want_plain, dtype, what + " no weight");
        if (h > 1) expect_norm_close(ops::rms_norm(strided_copy_of(x), w, 1e-6f), want, dtype, what + " strided");
      }
}

TEST(Norm, FastLayerNormReturnsOutMeanAndRstd) {
  for (auto mode : {ops::LayerNormImpl::high_precision, ops::LayerNormImpl::high_performance})
    for (DType dtype : kDTypes)
      for (int64_t h : kWidths) {
        // A large mean relative to the spread: the two-pass variance must not cancel.
        const Tensor x = random_tensor({2, 3, h}, 3, dtype, 2.0f, 50.0f);
        const Tensor w = random_tensor({h}, 4), b = random_tensor({h}, 5, DType::bf16);
        const std::vector<double> xv = values(x), wv = values(w), bv = values(b);
        std::vector<double> mean, rstd;
        row_stats(xv, h, 1e-5, mean, rstd);
        std::vector<double> want(xv.size()), want_plain(xv.size());
        for (std::size_t i = 0; i < xv.size(); ++i) {
          const std::size_t r = i / static_cast<std::size_t>(h), c = i % static_cast<std::size_t>(h);
          want_plain[i] = (xv[i] - mean[r]) * rstd[r];
          want[i] = want_plain[i] * wv[c] + bv[c];
        }
        const std::string what =
            std::string(dtype_name(dtype)) + " h=" + std::to_string(h) + " mode " + std::to_string(static_cast<int>(mode));
        const ops::LayerNormResult r = ops::fast_layernorm(x, w, b, 1e-5f, mode);
        expect_norm_close(r.out, want, dtype, what);
        EXPECT_EQ(r.mean.shape(), (Shape{2, 3})) << what;
        ASSERT_EQ(r.rstd.dtype(), DType::f32);
        const std::vector<double> mg = values(r.mean), rg = values(r.rstd);
        for (std::size_t i = 0; i < mean.size(); ++i) {
          EXPECT_NEAR(mg[i], mean[i], 1e-5 * std::fabs(mean[i])) << what;
          // 1 / sqrt(1e-5) for h = 1: relative tolerance only.
          EXPECT_NEAR(rg[i], rstd[i], 2e-5 * rstd[i]) << what;
        }
        expect_norm_close(ops::fast_layernorm(x, {}, {}, 1e-5f, mode).out, want_plain, dtype, what + " no affine");
        if (h > 1) expect_norm_close(ops::fast_layernorm(strided_copy_of(x), w, b, 1e-5f, mode).out, want, dtype, what + " strided");
      }
}

TEST(Norm, FastLayerNormFp16Mode) {
  const int64_t h = 17;
  const Tensor x = random_tensor({4, h}, 6, DType::f16), w = random_tensor({h}, 7, DType::f16), b = random_tensor({h}, 8, DType::f16);
  const std::vector<double> xv = values(x), wv = values(w), bv = values(b);
  std::vector<double> mean, rstd;
  row_stats(xv, h, 1e-5, mean, rstd);
  std::vector<double> want(xv.size());
  for (std::size_t i = 0; i < xv.size(); ++i) want[i] = (xv[i] - mean[i / h]) * rstd[i / h] * wv[i % h] + bv[i % h];
  expect_norm_close(ops::fast_layernorm(x, w, b, 1e-5f, ops::LayerNormImpl::fp16).out, want, DType::f16, "fp16");
  std::string msg = message_of([&] { ops::fast_layernorm(random_tensor({4, h}, 6), w, b, 1e-5f, ops::LayerNormImpl::fp16); });
  EXPECT_NE(msg.find("fast_layernorm: impl_mode fp16 needs f16 x, weight and bias, got x f32 [4, 17]"), std::string::npos) << msg;
  msg = message_of([&] { ops::fast_layernorm(x, {}, {}, 1e-5f, ops::LayerNormImpl::high_precision); });
  EXPECT_NE(msg.find("fast_layernorm: x must be f32 or bf16 (f16 needs impl_mode fp16), got f16 [4, 17]"), std::string::npos) << msg;
}

TEST(Norm, LayerNormScaleShiftForEveryScaleShape) {
  const int64_t batch = 2, s = 3;
  for (DType dtype : kDTypes)
    for (DType ptype : kDTypes)
      for (int64_t h : kWidths)
        for (int form = 0; form < 3; ++form) {
          const Shape pshape = form == 0 ? Shape{batch, h} : form == 1 ? Shape{batch, 1, h} : Shape{batch, s, h};
          const Tensor x = random_tensor({batch, s, h}, 9, dtype);
          const Tensor scale = random_tensor(pshape, 10, ptype, 0.5f), shift = random_tensor(pshape, 11, ptype);
          const Tensor w = random_tensor({h}, 12), b = random_tensor({h}, 13);
          const std::vector<double> xv = values(x), sc = values(scale), sh = values(shift), wv = values(w), bv = values(b);
          std::vector<double> mean, rstd;
          row_stats(xv, h, 1e-6, mean, rstd);
          std::vector<double> want(xv.size()), want_affine(xv.size());
          for (int64_t bi = 0; bi < batch; ++bi)
            for (int64_t si = 0; si < s; ++si)
              for (int64_t i = 0; i < h; ++i) {
                const int64_t row = bi * s + si, p = (form == 2 ? row : bi) * h + i;
                const double n = (xv[row * h + i] - mean[row]) * rstd[row];
                want[row * h + i] = n * (1 + sc[p]) + sh[p];
                want_affine[row * h + i] = (n * wv[i] + bv[i]) * (1 + sc[p]) + sh[p];
              }
          const std::string what = std::string(dtype_name(dtype)) + " params " + std::string(dtype_name(ptype)) +
                                   " h=" + std::to_string(h) + " scale " + shape_to_string(pshape);
          expect_norm_close(ops::layernorm_scale_shift(x, scale, shift), want, dtype, what);
          expect_norm_close(ops::layernorm_scale_shift(x, scale, shift, w, b), want_affine, dtype, what + " affine");
          if (h > 1)
            expect_norm_close(ops::layernorm_scale_shift(strided_copy_of(x), strided_copy_of(scale), shift, w, b), want_affine, dtype,
                              what + " strided");
        }
}

double silu(double v) { return v / (1.0 + std::exp(-v)); }

std::vector<double> silu_of(std::vector<double> v) {
  for (double& x : v) x = silu(x);
  return v;
}

// group_norm and group_norm_silu (the SiLU fused into the normalizing pass), on every kernel ISA
// this CPU runs.
TEST(Norm, GroupNormMatchesDefinition) {
  const std::pair<Shape, int64_t> cases[] = {{{2, 6, 7}, 3},   {{1, 4, 3, 5}, 2}, {{3, 5, 1}, 5},
                                             {{2, 8, 129}, 1}, {{1, 6}, 2},       {{2, 4, 17}, 4}};
  for (auto isa : {ops::vk::Isa::avx512, ops::vk::Isa::avx2, ops::vk::Isa::portable}) {
    if (!ops::vk::isa_supported(isa)) continue;
    setenv("CUBEVEC_VECTOR_ISA", std::string(ops::vk::isa_name(isa)).c_str(), 1);
    for (DType dtype : kDTypes)
      for (const auto& [shape, groups] : cases) {
        const int64_t n = shape[0], c = shape[1], hw = shape_numel(shape) / (n * c), cpg = c / groups;
        const Tensor x = random_tensor(shape, 14, dtype, 2.0f, 10.0f);
        const Tensor w = random_tensor({c}, 15, DType::bf16), b = random_tensor({c}, 16);
        const std::vector<double> xv = values(x), wv = values(w), bv = values(b);
        std::vector<double> mean, rstd;
        row_stats(xv, cpg * hw, 1e-5, mean, rstd);  // a group is cpg * hw contiguous values
        std::vector<double> want(xv.size()), want_plain(xv.size());
        for (std::size_t i = 0; i < xv.size(); ++i) {
          const auto g = static_cast<int64_t>(i) / (cpg * hw), ch = static_cast<int64_t>(i) / hw % c;
          want_plain[i] = (xv[i] - mean[g]) * rstd[g];
          want[i] = want_plain[i] * wv[ch] + bv[ch];
        }
        const std::string what = std::string(ops::vk::isa_name(isa)) + " " + std::string(dtype_name(dtype)) + " " + shape_to_string(shape) +
                                 " groups " + std::to_string(groups);
        expect_norm_close(ops::group_norm(x, groups, w, b), want, dtype, what);
        expect_norm_close(ops::group_norm(x, groups), want_plain, dtype, what + " no affine");
        expect_norm_close(ops::group_norm(strided_copy_of(x), groups, w, b), want, dtype, what + " strided");
        expect_norm_close(ops::group_norm_silu(x, groups, w, b), silu_of(want), dtype, what + " silu");
        expect_norm_close(ops::group_norm_silu(x, groups), silu_of(want_plain), dtype, what + " silu no affine");
        expect_norm_close(ops::group_norm_silu(strided_copy_of(x), groups, w, b), silu_of(want), dtype, what + " silu strided");
      }
    unsetenv("CUBEVEC_VECTOR_ISA");
  }
}

// Wan's RMS_norm: F.normalize(x, dim=1) * scale * weight, on every kernel ISA this CPU runs, with
// inner sizes around the kernel's 256-column blocks, a zero column (eps), and a strided x.
TEST(Norm, NormalizeChannelsMatchesDefinition) {
  const Shape shapes[] = {{2, 5, 7}, {1, 3, 2, 3, 43}, {2, 16, 257}, {1, 1, 9}, {3, 4}, {1, 7, 513}};
  for (auto isa : {ops::vk::Isa::avx512, ops::vk::Isa::avx2, ops::vk::Isa::portable}) {
    if (!ops::vk::isa_supported(isa)) continue;
    setenv("CUBEVEC_VECTOR_ISA", std::string(ops::vk::isa_name(isa)).c_str(), 1);
    for (DType dtype : kDTypes)
      for (const Shape& shape : shapes) {
        const int64_t n = shape[0], c = shape[1], s = shape_numel(shape) / (n * c);
        Tensor x = random_tensor(shape, 18, dtype, 2.0f, 0.5f);
        if (dtype == DType::f32) {  // column 0 of sample 0 all zeros: 0 / max(0, eps) = 0
          std::vector<double> v = values(x);
          for (int64_t ch = 0; ch < c; ++ch) v[static_cast<std::size_t>(ch * s)] = 0;
          x = Tensor::from_vector(std::vector<float>(v.begin(), v.end()), shape);
        }
        const Tensor w = random_tensor({c}, 19, DType::bf16);
        const std::vector<double> xv = values(x), wv = values(w);
        const double scale = std::sqrt(static_cast<double>(c));
        std::vector<double> want(xv.size()), want_plain(xv.size());
        for (int64_t b = 0; b < n; ++b)
          for (int64_t i = 0; i < s; ++i) {
            double sq = 0;
            for (int64_t ch = 0; ch < c; ++ch) sq += std::pow(xv[static_cast<std::size_t>((b * c + ch) * s + i)], 2);
            const double norm = std::max(std::sqrt(sq), 1e-12);
            for (int64_t ch = 0; ch < c; ++ch) {
              const auto at = static_cast<std::size_t>((b * c + ch) * s + i);
              want_plain[at] = xv[at] / norm;
              want[at] = xv[at] / norm * scale * wv[static_cast<std::size_t>(ch)];
            }
          }
        const std::string what = std::string(ops::vk::isa_name(isa)) + " " + std::string(dtype_name(dtype)) + " " + shape_to_string(shape);
        const Tensor y = ops::normalize_channels(x, w, static_cast<float>(scale));
        EXPECT_EQ(y.shape(), shape) << what;
        expect_norm_close(y, want, dtype, what);
        expect_norm_close(ops::normalize_channels(x, Tensor()), want_plain, dtype, what + " no weight");
        expect_norm_close(ops::normalize_channels(strided_copy_of(x), w, static_cast<float>(scale)), want, dtype, what + " strided");
        expect_norm_close(ops::normalize_channels_silu(x, w, static_cast<float>(scale)), silu_of(want), dtype, what + " silu");
        expect_norm_close(ops::normalize_channels_silu(strided_copy_of(x), Tensor()), silu_of(want_plain), dtype,
                          what + " silu strided, no weight");
      }
    unsetenv("CUBEVEC_VECTOR_ISA");
  }
  const Tensor x = random_tensor({2, 3, 4}, 20);
  std::string msg = message_of([&] { ops::normalize_channels(x, random_tensor({4}, 1)); });
  EXPECT_NE(msg.find("normalize_channels: weight must have shape [C] = [3] with C the channels of x [2, 3, 4], got [4]"), std::string::npos)
      << msg;
  msg = message_of([&] { ops::normalize_channels(x.select(0, 0).select(0, 0), Tensor()); });
  EXPECT_NE(msg.find("normalize_channels: x must be [N, C, *], got f32 [4]"), std::string::npos) << msg;
  msg = message_of([&] { ops::normalize_channels(x, Tensor(), 1.0f, 0.0f); });
  EXPECT_NE(msg.find("normalize_channels: eps must be positive"), std::string::npos) << msg;
}

TEST(Norm, ErrorsNameWhatWasExpected) {
  const Tensor x = random_tensor({2, 3, 4}, 17);
  std::string msg = message_of([&] { ops::rms_norm(x, random_tensor({7}, 6)); });
  EXPECT_NE(msg.find("rms_norm: weight must have shape [H] = [4] with H the last size of x [2, 3, 4], got [7]"), std::string::npos) << msg;
  msg = message_of([&] { ops::rms_norm(x, Tensor(), 0.0f); });
  EXPECT_NE(msg.find("rms_norm: eps must be positive"), std::string::npos) << msg;
  msg = message_of([&] { ops::rms_norm(x, Tensor::zeros({4}, DType::i32)); });
  EXPECT_NE(msg.find("rms_norm: weight must be f32 or bf16, got i32 [4]"), std::string::npos) << msg;
  msg = message_of([&] { ops::layernorm_scale_shift(x, random_tensor({2, 2, 4}, 1), random_tensor({2, 2, 4}, 2)); });
  EXPECT_NE(msg.find("layernorm_scale_shift: scale must have shape [B, H], [B, 1, H] or [B, S, H] = [2, 4], "
                     "[2, 1, 4] or [2, 3, 4] for x [2, 3, 4], got [2, 2, 4]"),
            std::string::npos)
      << msg;
  msg = message_of([&] { ops::layernorm_scale_shift(x, random_tensor({2, 4}, 1), random_tensor({2, 1, 4}, 2)); });
  EXPECT_NE(msg.find("layernorm_scale_shift: scale and shift must have the same shape, got [2, 4] and [2, 1, 4]"), std::string::npos)
      << msg;
  msg = message_of([&] { ops::layernorm_scale_shift(x.select(0, 0), random_tensor({2, 4}, 1), random_tensor({2, 4}, 2)); });
  EXPECT_NE(msg.find("layernorm_scale_shift: x must be [B, S, H], got f32 [3, 4]"), std::string::npos) << msg;
  msg = message_of([&] { ops::fast_layernorm(x, random_tensor({4}, 1), random_tensor({5}, 2)); });
  EXPECT_NE(msg.find("fast_layernorm: bias must have shape [H] = [4] with H the last size of x [2, 3, 4], got [5]"), std::string::npos)
      << msg;
  msg = message_of([&] { ops::group_norm(x, 2); });
  EXPECT_NE(msg.find("group_norm: num_groups must be positive and divide the channel count C = 3 of x [2, 3, 4], got 2"), std::string::npos)
      << msg;
  msg = message_of([&] { ops::group_norm_silu(x, 0); });
  EXPECT_NE(msg.find("group_norm_silu: num_groups must be positive and divide the channel count C = 3 of x [2, 3, 4], got 0"),
            std::string::npos)
      << msg;
  msg = message_of([&] { ops::group_norm(x, 3, random_tensor({4}, 1)); });
  EXPECT_NE(msg.find("group_norm: weight must have shape [C] = [3]"), std::string::npos) << msg;
}

TEST(Norm, SimulateModeRecordsCostsWithoutData) {
  Device device(builtin_cpu_profile(), {.simulate = true});
  const Stream stream = device.new_stream("sim");
  const Tensor x = Tensor::meta({2, 5, 8}, DType::bf16);
  const Tensor y = ops::layernorm_scale_shift(x, Tensor::meta({2, 8}, DType::f32), Tensor::meta({2, 8}, DType::f32), {}, {}, 1e-6f, stream);
  const Tensor z = ops::group_norm(ops::rms_norm(y, {}, 1e-6f, stream), 5, {}, {}, 1e-5f, stream);
  stream.synchronize();
  EXPECT_EQ(z.shape(), x.shape());
  EXPECT_EQ(z.dtype(), DType::bf16);
  EXPECT_FALSE(z.has_storage());
  EXPECT_GE(device.stats().kernels, 3u);
}

}  // namespace norm_test
}  // namespace cubevec
