// conv2d / conv3d (im2col + GEMM, and the register-tiled direct kernel for few channels) against
// direct convolution loops written here.
#include "ops/conv.h"
#include "ops/conv_direct.h"
#include "ops/vector_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/tensor_testing.h"

namespace cubevec {
namespace conv_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

// Direct 3-D convolution (2-D is the T = kt = 1 case), zero padding, in double.
std::vector<double> direct_conv(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>* bias, int64_t n,
                                int64_t c, int64_t o, std::array<int64_t, 3> in, std::array<int64_t, 3> k, std::array<int64_t, 3> stride,
                                std::array<int64_t, 3> pad, std::array<int64_t, 3> dil, std::array<int64_t, 3>& out) {
  for (int d = 0; d < 3; ++d) out[d] = (in[d] + 2 * pad[d] - dil[d] * (k[d] - 1) - 1) / stride[d] + 1;
  std::vector<double> y(static_cast<std::size_t>(n * o * out[0] * out[1] * out[2]));
  std::size_t idx = 0;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t oc = 0; oc < o; ++oc)
      for (int64_t t = 0; t < out[0]; ++t)
        for (int64_t h = 0; h < out[1]; ++h)
          for (int64_t ww = 0; ww < out[2]; ++ww) {
            double s = bias ? (*bias)[oc] : 0.0;
            for (int64_t ic = 0; ic < c; ++ic)
              for (int64_t kt = 0; kt < k[0]; ++kt)
                for (int64_t kh = 0; kh < k[1]; ++kh)
                  for (int64_t kw = 0; kw < k[2]; ++kw) {
                    const int64_t it = t * stride[0] - pad[0] + kt * dil[0], ih = h * stride[1] - pad[1] + kh * dil[1],
                                  iw = ww * stride[2] - pad[2] + kw * dil[2];
                    if (it < 0 || ih < 0 || iw < 0 || it >= in[0] || ih >= in[1] || iw >= in[2]) continue;
                    s += double(x[(((b * c + ic) * in[0] + it) * in[1] + ih) * in[2] + iw]) *
                         w[(((oc * c + ic) * k[0] + kt) * k[1] + kh) * k[2] + kw];
                  }
            y[idx++] = s;
          }
  return y;
}

TEST(Conv, Conv2dMatchesDirectLoops) {
  struct Case {
    int64_t n, c, o, h, w, kh, kw, stride, pad, dil;
  };
  const Case cases[] = {{1, 3, 8, 9, 7, 3, 3, 1, 1, 1},
                        {2, 5, 4, 16, 16, 3, 3, 2, 1, 1},
                        {1, 4, 6, 8, 8, 1, 1, 1, 0, 1},
                        {1, 2, 3, 11, 13, 3, 2, 1, 2, 2},
                        {1, 16, 16, 70, 70, 3, 3, 1, 1, 1}};
  for (const Case& s : cases) {
    const auto x = random_values(s.n * s.c * s.h * s.w, 1), w = random_values(s.o * s.c * s.kh * s.kw, 2), bias = random_values(s.o, 3);
    ops::Conv2dOptions opt;
    opt.stride = {s.stride, s.stride};
    opt.padding = {s.pad, s.pad};
    opt.dilation = {s.dil, s.dil};
    const Tensor y = ops::conv2d(Tensor::from_vector(x, {s.n, s.c, s.h, s.w}), Tensor::from_vector(w, {s.o, s.c, s.kh, s.kw}),
                                 Tensor::from_vector(bias, {s.o}), opt);
    std::array<int64_t, 3> out{};
    const auto want = direct_conv(x, w, &bias, s.n, s.c, s.o, {1, s.h, s.w}, {1, s.kh, s.kw}, {1, s.stride, s.stride}, {0, s.pad, s.pad},
                                  {1, s.dil, s.dil}, out);
    ASSERT_EQ(y.shape(), (Shape{s.n, s.o, out[1], out[2]}));
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(y.data<float>()[i], want[i], 1e-4) << "case c=" << s.c << " at " << i;
  }
}

TEST(Conv, Conv3dMatchesDirectLoopsIncludingWanPatchEmbedding) {
  // Wan's patch embedding: kernel = stride = (1, 2, 2); and a 3x3x3 VAE-style conv with padding.
  struct Case {
    int64_t c, o, t, h, w;
    std::array<int64_t, 3> k, stride, pad;
  };
  // More than one 4096-position im2col block (the second starting mid-row), a stride in the last
  // dim, and padding wider than the kernel reach.
  const Case cases[] = {{4, 8, 3, 8, 6, {1, 2, 2}, {1, 2, 2}, {0, 0, 0}},
                        {3, 5, 4, 7, 9, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}},
                        {2, 3, 5, 21, 43, {3, 3, 3}, {1, 1, 1}, {2, 1, 1}},
                        {2, 4, 4, 9, 31, {3, 1, 3}, {1, 2, 3}, {1, 0, 3}}};
  for (const Case& s : cases) {
    const auto x = random_values(s.c * s.t * s.h * s.w, 4), w = random_values(s.o * s.c * s.k[0] * s.k[1] * s.k[2], 5);
    ops::Conv3dOptions opt;
    opt.stride = s.stride;
    opt.padding = s.pad;
    const Tensor y =
        ops::conv3d(Tensor::from_vector(x, {1, s.c, s.t, s.h, s.w}), Tensor::from_vector(w, {s.o, s.c, s.k[0], s.k[1], s.k[2]}), {}, opt);
    std::array<int64_t, 3> out{};
    const auto want = direct_conv(x, w, nullptr, 1, s.c, s.o, {s.t, s.h, s.w}, s.k, s.stride, s.pad, {1, 1, 1}, out);
    ASSERT_EQ(y.shape(), (Shape{1, s.o, out[0], out[1], out[2]}));
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(y.data<float>()[i], want[i], 1e-4) << i;
  }
}

// The direct kernel's edges: output channel counts around its 8-channel tiles, widths around its
// 16-pixel (AVX2: 8) vectors and 16-96-pixel blocks (1 and below one vector included), padding up to wider than
// the kernel's reach (rows and columns of pure padding: bias only), wide and 1-wide kernels, 3-D
// kernels (Wan's causal VAE pads time on one side only: done here as a 2-frame pad with 3 frames in),
// and batches. Through conv2d / conv3d (which take the direct kernel for <= 64 output channels on
// AVX-512 CPUs, <= 128 on AVX2: both sides of each limit) and each of the AVX-512 and AVX2 kernels
// the CPU runs.
TEST(Conv, FewChannelConvolutionsMatchDirectLoops) {
  struct Case {
    int64_t n, c, o, t, h, w;
    std::array<int64_t, 3> k, pad;
  };
  const Case cases[] = {
      {1, 3, 1, 1, 5, 1, {1, 3, 3}, {0, 1, 1}},    {1, 2, 3, 1, 7, 15, {1, 3, 3}, {0, 1, 1}},  {2, 4, 8, 1, 6, 16, {1, 3, 3}, {0, 1, 1}},
      {1, 5, 9, 1, 4, 17, {1, 3, 3}, {0, 0, 0}},   {1, 3, 16, 1, 9, 47, {1, 5, 5}, {0, 2, 2}}, {1, 6, 17, 1, 3, 49, {1, 3, 3}, {0, 4, 4}},
      {1, 2, 20, 1, 5, 100, {1, 1, 7}, {0, 0, 3}}, {1, 3, 64, 1, 4, 33, {1, 3, 3}, {0, 1, 1}}, {1, 16, 3, 1, 8, 96, {1, 3, 3}, {0, 1, 1}},
      {1, 2, 5, 1, 3, 2, {1, 3, 16}, {0, 1, 8}},   {1, 4, 12, 3, 5, 21, {3, 3, 3}, {2, 1, 1}}, {2, 3, 7, 4, 6, 19, {3, 3, 3}, {1, 1, 1}},
      {1, 2, 4, 2, 3, 64, {1, 3, 3}, {0, 1, 1}},   {1, 3, 65, 1, 4, 20, {1, 3, 3}, {0, 1, 1}}, {1, 2, 128, 1, 3, 9, {1, 3, 3}, {0, 1, 1}},
      {1, 2, 129, 1, 3, 9, {1, 3, 3}, {0, 1, 1}}};
  for (const Case& s : cases) {
    const auto x = random_values(s.n * s.c * s.t * s.h * s.w, 21), w = random_values(s.o * s.c * s.k[0] * s.k[1] * s.k[2], 22),
               bias = random_values(s.o, 23);
    std::array<int64_t, 3> out{};
    const auto want = direct_conv(x, w, &bias, s.n, s.c, s.o, {s.t, s.h, s.w}, s.k, {1, 1, 1}, s.pad, {1, 1, 1}, out);
    const std::string label = "c=" + std::to_string(s.c) + " o=" + std::to_string(s.o) + " w=" + std::to_string(s.w);
    ops::Conv3dOptions opt;
    opt.padding = s.pad;
    const Tensor y = ops::conv3d(Tensor::from_vector(x, {s.n, s.c, s.t, s.h, s.w}),
                                 Tensor::from_vector(w, {s.o, s.c, s.k[0], s.k[1], s.k[2]}), Tensor::from_vector(bias, {s.o}), opt);
    ASSERT_EQ(y.shape(), (Shape{s.n, s.o, out[0], out[1], out[2]})) << label;
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(y.data<float>()[i], want[i], 1e-4) << label << " at " << i;
    if (s.t == 1 && s.k[0] == 1) {  // the same as a 2-D convolution
      ops::Conv2dOptions opt2;
      opt2.padding = {s.pad[1], s.pad[2]};
      const Tensor y2 = ops::conv2d(Tensor::from_vector(x, {s.n, s.c, s.h, s.w}), Tensor::from_vector(w, {s.o, s.c, s.k[1], s.k[2]}),
                                    Tensor::from_vector(bias, {s.o}), opt2);
      for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(y2.data<float>()[i], want[i], 1e-4) << label << " (2-D) at " << i;
    }
    const ops::conv_direct::Shape<3> shape{s.c, s.o, {s.t, s.h, s.w}, s.k, out, s.pad};
    for (const ops::Isa isa : {ops::Isa::avx512, ops::Isa::avx2}) {  // each kernel this CPU runs, on the first image
      if (!ops::isa_supported(isa)) continue;
      std::vector<float> direct(want.size() / static_cast<std::size_t>(s.n));
      ops::conv_direct::convolve<3>(x.data(), w.data(), bias.data(), direct.data(), shape, isa);
      for (std::size_t i = 0; i < direct.size(); ++i)
        ASSERT_NEAR(direct[i], want[i], 1e-4) << label << " (" << ops::isa_name(isa) << " kernel) at " << i;
    }
  }
}

// im2col writes its columns straight into the GEMM's packed panels: deep im2col matrices (C x kernel
// volume past one and two K blocks of the f32 kernel's KC, with a short last block), output
// positions over more than one block of columns with a last block that is not whole NR panels,
// strides, dilation and padding, im2col forced (`direct = false`), over 64 output channels. Small
// cases against the loop above; the two with more positions than one block takes (at most 4,096;
// tens of millions of products, too slow for the unoptimized loop) against the reference backend
// (a plain im2col matrix and a plain GEMM loop).
TEST(Conv, DeepIm2colThroughPackedPanelsMatchesTheReferences) {
  struct Case {
    int64_t c, o, t, h, w;
    std::array<int64_t, 3> k, stride, pad, dil;
    bool loop;  // against direct_conv, else against the reference backend
  };
  const Case cases[] = {{20, 65, 3, 7, 9, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, true},      // K 540: a 28-deep last K block
                        {30, 65, 1, 23, 29, {1, 3, 3}, {1, 2, 2}, {0, 2, 1}, {1, 2, 1}, true},    // K 270, strided, dilated
                        {8, 70, 1, 70, 61, {1, 3, 3}, {1, 1, 1}, {0, 1, 1}, {1, 1, 1}, false},    // 4,270 positions: 4,096 + 174
                        {20, 65, 2, 48, 45, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}, false}};  // K 540 and 4,320 positions
  for (const Case& s : cases) {
    const auto x = random_values(s.c * s.t * s.h * s.w, 31), w = random_values(s.o * s.c * s.k[0] * s.k[1] * s.k[2], 32),
               bias = random_values(s.o, 33);
    const Tensor xt = Tensor::from_vector(x, {1, s.c, s.t, s.h, s.w}), wt = Tensor::from_vector(w, {s.o, s.c, s.k[0], s.k[1], s.k[2]}),
                 bt = Tensor::from_vector(bias, {s.o});
    ops::Conv3dOptions opt;
    opt.stride = s.stride, opt.padding = s.pad, opt.dilation = s.dil;
    opt.direct = false;  // im2col + GEMM whatever the direct kernel's reach on this CPU
    const Tensor y = ops::conv3d(xt, wt, bt, opt);
    std::vector<double> want;
    if (s.loop) {
      std::array<int64_t, 3> out{};
      want = direct_conv(x, w, &bias, 1, s.c, s.o, {s.t, s.h, s.w}, s.k, s.stride, s.pad, s.dil, out);
    } else {
      ops::Conv3dOptions reference = opt;
      reference.backend = ops::GemmBackend::reference;
      const Tensor r = ops::conv3d(xt, wt, bt, reference);
      want.assign(r.data<float>(), r.data<float>() + r.numel());
    }
    ASSERT_EQ(static_cast<std::size_t>(y.numel()), want.size());
    const double tolerance = 2e-5 * std::sqrt(static_cast<double>(s.c * s.k[0] * s.k[1] * s.k[2]));  // f32 sums of K products
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(y.data<float>()[i], want[i], tolerance) << "c=" << s.c << " o=" << s.o << " at " << i;
  }
}

// Asking the direct kernel for an ISA it has no kernel for, or that the CPU lacks, is a named error
// (never SIGILL).
TEST(Conv, DirectKernelForAnIsaItLacksIsANamedError) {
  const std::vector<float> x(2 * 4 * 4, 1.0f), w(3 * 2 * 9, 1.0f);
  std::vector<float> out(3 * 4 * 4);
  const ops::conv_direct::Shape<3> shape{2, 3, {1, 4, 4}, {1, 3, 3}, {1, 4, 4}, {0, 1, 1}};
  EXPECT_NE(message_of([&] {
              ops::conv_direct::convolve<3>(x.data(), w.data(), nullptr, out.data(), shape, ops::Isa::portable);
            }).find("no direct kernel for ISA portable"),
            std::string::npos);
  for (const ops::Isa isa : {ops::Isa::avx512, ops::Isa::avx2}) {
    if (ops::isa_supported(isa)) continue;
    EXPECT_NE(message_of([&] {
                ops::conv_direct::convolve<3>(x.data(), w.data(), nullptr, out.data(), shape, isa);
              }).find("this CPU does not run"),
              std::string::npos);
  }
}

// 300 random few-channel shapes (kernels up to 5 x 5, padding up to 3, widths 1 to 70, output
// channels 1 to 70: both sides of the AVX-512 direct kernel's 64) against the reference backend (im2col and
// a plain GEMM loop), and non-finite inputs: NaN and infinity land where the reference puts them.
TEST(Conv, RandomShapesAndNonFiniteInputsMatchTheReference) {
  std::mt19937 rng(5);
  const auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t c = pick(1, 6), o = pick(1, 70), kh = pick(1, 5), kw = pick(1, 5), ph = pick(0, 3), pw = pick(0, 3);
    const int64_t h = std::max<int64_t>(pick(1, 9), kh - 2 * ph), w = std::max<int64_t>(pick(1, 70), kw - 2 * pw);
    auto x = random_values(c * h * w, static_cast<unsigned>(100 + trial));
    if (trial % 10 == 0) x[static_cast<std::size_t>(pick(0, c * h * w - 1))] = NAN;
    if (trial % 10 == 5) x[static_cast<std::size_t>(pick(0, c * h * w - 1))] = INFINITY;
    const auto weight = random_values(o * c * kh * kw, static_cast<unsigned>(500 + trial)), bias = random_values(o, 7);
    ops::Conv2dOptions fast, reference;
    fast.padding = reference.padding = {ph, pw};
    reference.backend = ops::GemmBackend::reference;
    const Tensor xt = Tensor::from_vector(x, {1, c, h, w}), wt = Tensor::from_vector(weight, {o, c, kh, kw}),
                 bt = Tensor::from_vector(bias, {o});
    const Tensor got = ops::conv2d(xt, wt, bt, fast), want = ops::conv2d(xt, wt, bt, reference);
    ASSERT_EQ(got.shape(), want.shape());
    const std::string label = "trial " + std::to_string(trial) + ": " + shape_to_string(xt.shape()) + " * " + shape_to_string(wt.shape()) +
                              " padding " + std::to_string(ph) + "," + std::to_string(pw);
    for (int64_t i = 0; i < got.numel(); ++i) {
      const float g = got.data<float>()[i], r = want.data<float>()[i];
      if (std::isnan(r) || std::isinf(r)) {
        ASSERT_TRUE(std::isnan(g) == std::isnan(r) && (std::isnan(r) || g == r)) << label << " at " << i << ": " << g << " vs " << r;
      } else {
        ASSERT_NEAR(g, r, 1e-4f * (1.0f + std::fabs(r))) << label << " at " << i;
      }
    }
  }
}

// conv2d_add: the residual added as the output is stored, through the direct kernel (each ISA this
// CPU runs), im2col + GEMM (over 64 channels, and forced), and the pointwise GEMM: against the
// loop above plus the residual in double, and bit for bit against conv2d followed by add.
TEST(Conv, Conv2dAddMatchesConvolutionPlusResidual) {
  struct Case {
    int64_t n, c, o, h, w, k, pad;
    bool direct;
  };
  const Case cases[] = {{1, 3, 8, 9, 37, 3, 1, true},  {2, 4, 5, 6, 17, 3, 1, true}, {1, 5, 70, 7, 11, 3, 1, true},
                        {1, 4, 6, 8, 21, 3, 1, false}, {2, 6, 3, 5, 9, 1, 0, true},  {1, 2, 16, 4, 50, 3, 0, true}};
  for (const Case& s : cases) {
    const auto x = random_values(s.n * s.c * s.h * s.w, 31), w = random_values(s.o * s.c * s.k * s.k, 32), bias = random_values(s.o, 33);
    std::array<int64_t, 3> out{};
    std::vector<double> want =
        direct_conv(x, w, &bias, s.n, s.c, s.o, {1, s.h, s.w}, {1, s.k, s.k}, {1, 1, 1}, {0, s.pad, s.pad}, {1, 1, 1}, out);
    const auto residual = random_values(want.size(), 34);
    for (std::size_t i = 0; i < want.size(); ++i) want[i] += residual[i];
    const std::string label =
        "c=" + std::to_string(s.c) + " o=" + std::to_string(s.o) + " k=" + std::to_string(s.k) + (s.direct ? "" : " im2col forced");
    ops::Conv2dOptions opt;
    opt.padding = {s.pad, s.pad};
    opt.direct = s.direct;
    const Tensor xt = Tensor::from_vector(x, {s.n, s.c, s.h, s.w}), wt = Tensor::from_vector(w, {s.o, s.c, s.k, s.k}),
                 bt = Tensor::from_vector(bias, {s.o}), rt = Tensor::from_vector(residual, {s.n, s.o, out[1], out[2]});
    const Tensor y = ops::conv2d_add(xt, wt, bt, rt, opt);
    ASSERT_EQ(y.shape(), rt.shape()) << label;
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(y.data<float>()[i], want[i], 1e-4) << label << " at " << i;
    const Tensor separate = ops::add(rt, ops::conv2d(xt, wt, bt, opt));
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(y.data<float>()[i], separate.data<float>()[i]) << label << ": not conv2d + add bit for bit at " << i;
    if (s.k == 1) continue;
    const ops::conv_direct::Shape<2> shape{s.c, s.o, {s.h, s.w}, {s.k, s.k}, {out[1], out[2]}, {s.pad, s.pad}};
    for (const ops::Isa isa : {ops::Isa::avx512, ops::Isa::avx2}) {  // each kernel this CPU runs, on the first image
      if (!ops::isa_supported(isa)) continue;
      std::vector<float> direct(want.size() / static_cast<std::size_t>(s.n));
      ops::conv_direct::convolve<2>(x.data(), w.data(), bias.data(), direct.data(), shape, isa, residual.data());
      for (std::size_t i = 0; i < direct.size(); ++i)
        ASSERT_NEAR(direct[i], want[i], 1e-4) << label << " (" << ops::isa_name(isa) << " kernel) at " << i;
    }
  }
  const Tensor x = Tensor::from_vector(random_values(2 * 3 * 4 * 4, 35), {2, 3, 4, 4});
  const Tensor w = Tensor::from_vector(random_values(5 * 3 * 9, 36), {5, 3, 3, 3});
  ops::Conv2dOptions pad1;
  pad1.padding = {1, 1};
  EXPECT_NE(message_of([&] {
              ops::conv2d_add(x, w, {}, Tensor::zeros({2, 5, 4, 3}, DType::f32), pad1);
            }).find("conv2d_add: residual must have the output's shape [2, 5, 4, 4], got [2, 5, 4, 3]"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              ops::conv2d_add(x, w, {}, Tensor::zeros({2, 5, 4, 4}, DType::bf16), pad1);
            }).find("conv2d_add: residual"),
            std::string::npos);
  EXPECT_NE(message_of([&] { ops::conv2d_add(x, w, {}, Tensor(), pad1); }).find("conv2d_add: residual must be a tensor"),
            std::string::npos);
}

// conv3d_add: the same through the 3-D paths (the Wan VAE's 3 x 3 x 3 causal convolutions and its
// 1 x 1 x 1 shortcut), direct kernel, forced im2col and pointwise.
TEST(Conv, Conv3dAddMatchesConvolutionPlusResidual) {
  struct Case {
    int64_t c, o, t, h, w, k, pad_t;
    bool direct;
  };
  const Case cases[] = {
      {3, 8, 4, 5, 19, 3, 0, true}, {4, 70, 3, 4, 9, 3, 1, true}, {5, 6, 3, 4, 7, 3, 0, false}, {6, 5, 2, 3, 9, 1, 0, true}};
  for (const Case& s : cases) {
    const int64_t pad = s.k / 2;
    const auto x = random_values(s.c * s.t * s.h * s.w, 41), w = random_values(s.o * s.c * s.k * s.k * s.k, 42),
               bias = random_values(s.o, 43);
    std::array<int64_t, 3> out{};
    std::vector<double> want =
        direct_conv(x, w, &bias, 1, s.c, s.o, {s.t, s.h, s.w}, {s.k, s.k, s.k}, {1, 1, 1}, {s.pad_t, pad, pad}, {1, 1, 1}, out);
    const auto residual = random_values(want.size(), 44);
    for (std::size_t i = 0; i < want.size(); ++i) want[i] += residual[i];
    const std::string label =
        "c=" + std::to_string(s.c) + " o=" + std::to_string(s.o) + " k=" + std::to_string(s.k) + (s.direct ? "" : " im2col forced");
    ops::Conv3dOptions opt;
    opt.padding = {s.pad_t, pad, pad};
    opt.direct = s.direct;
    const Tensor xt = Tensor::from_vector(x, {1, s.c, s.t, s.h, s.w}), wt = Tensor::from_vector(w, {s.o, s.c, s.k, s.k, s.k}),
                 bt = Tensor::from_vector(bias, {s.o}), rt = Tensor::from_vector(residual, {1, s.o, out[0], out[1], out[2]});
    const Tensor y = ops::conv3d_add(xt, wt, bt, rt, opt);
    ASSERT_EQ(y.shape(), rt.shape()) << label;
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(y.data<float>()[i], want[i], 1e-4) << label << " at " << i;
    const Tensor separate = ops::add(rt, ops::conv3d(xt, wt, bt, opt));
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_EQ(y.data<float>()[i], separate.data<float>()[i]) << label << ": not conv3d + add bit for bit at " << i;
  }
  const Tensor x = Tensor::from_vector(random_values(3 * 2 * 4 * 4, 45), {1, 3, 2, 4, 4});
  const Tensor w = Tensor::from_vector(random_values(5 * 3, 46), {5, 3, 1, 1, 1});
  EXPECT_NE(message_of([&] {
              ops::conv3d_add(x, w, {}, Tensor::zeros({1, 5, 2, 4, 3}, DType::f32));
            }).find("conv3d_add: residual must have the output's shape [1, 5, 2, 4, 4], got [1, 5, 2, 4, 3]"),
            std::string::npos);
  EXPECT_NE(message_of([&] { ops::conv3d_add(x, w, {}, Tensor()); }).find("conv3d_add: residual must be a tensor"), std::string::npos);
}

TEST(Conv, ErrorsNameTheShapes) {
  const Tensor x = Tensor::from_vector(random_values(2 * 3 * 4 * 4, 6), {2, 3, 4, 4});
  EXPECT_NE(message_of([&] {
              ops::conv2d(x, Tensor::from_vector(random_values(2 * 2 * 9, 7), {2, 2, 3, 3}));
            }).find("weight must be [O, C, kh, kw] with C = 3"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              ops::conv2d(x, Tensor::from_vector(random_values(2 * 3 * 25, 8), {2, 3, 5, 5}));
            }).find("does not fit"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              ops::conv3d(x, Tensor::from_vector(random_values(27, 9), {1, 1, 3, 3, 3}));
            }).find("x must be [N, C, T, H, W]"),
            std::string::npos);
  ops::Conv2dOptions bad;
  bad.stride = {0, 1};
  EXPECT_NE(message_of([&] {
              ops::conv2d(x, Tensor::from_vector(random_values(3 * 3, 10), {1, 3, 1, 3}), {}, bad);
            }).find("stride and dilation must be >= 1"),
            std::string::npos);
}

}  // namespace conv_test
}  // namespace cubevec
