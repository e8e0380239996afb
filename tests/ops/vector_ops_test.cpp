// Vector ops (activations, softmax, broadcasting arithmetic, muls_add, cast, contiguous) against
// double-precision definitions written here, on odd widths (1, 7, 17, 129: not multiples of any
// vector width), f32 and bf16, contiguous and strided inputs, and on every kernel ISA this CPU has.
// Tolerances: f32 |got - want| <= 1e-5 |want| + 1e-6; bf16 (reference from the bf16-rounded
// inputs) |got - want| <= 2^-8 |want| + 1e-5, i.e. about one bf16 ulp of the output.
#include "ops/vector_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>

#include "ops/vector/kernels.h"
#include "tensor/half.h"

#include "common/tensor_testing.h"
#include "common/vector_isa.h"

namespace cubevec {
namespace vector_ops_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;

const auto for_each_isa = for_each_vector_isa;

constexpr int64_t kWidths[] = {1, 7, 17, 129};
constexpr DType kDTypes[] = {DType::f32, DType::bf16};

double definition(ops::Activation kind, double v) {
  switch (kind) {
    case ops::Activation::relu: return v > 0 ? v : 0.0;
    case ops::Activation::silu: return v / (1 + std::exp(-v));
    case ops::Activation::mish: return v * std::tanh(std::log(1 + std::exp(v)));
    case ops::Activation::gelu: return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    case ops::Activation::gelu_tanh: return 0.5 * v * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    case ops::Activation::gelu_fast: return v / (1 + std::exp(-1.702 * std::fabs(v))) * std::exp(0.851 * (v - std::fabs(v)));
  }
  return v;
}

TEST(VectorOps, ActivationNamesAreCaseInsensitive) {
  using ops::Activation;
  const std::pair<const char*, Activation> names[] = {
      {"relu", Activation::relu}, {"SiLU", Activation::silu},           {"swish", Activation::silu},         {"Mish", Activation::mish},
      {"GELU", Activation::gelu}, {"gelu-tanh", Activation::gelu_tanh}, {"Gelu-Fast", Activation::gelu_fast}};
  for (const auto& [name, kind] : names) EXPECT_EQ(ops::get_activation_layer(name), kind) << name;
  const std::string msg = message_of([] { ops::get_activation_layer("tanhh"); });
  EXPECT_NE(msg.find("unknown activation 'tanhh' (expected one of: relu, silu, swish, mish, gelu, gelu-tanh, gelu-fast)"),
            std::string::npos)
      << msg;
}

TEST(VectorOps, ActivationReferenceIsTheDefinition) {
  for (int k = 0; k < 6; ++k)
    for (double v : {-30.0, -4.5, -0.3, 0.0, 0.7, 5.0, 30.0})
      EXPECT_NEAR(ops::activation_reference(static_cast<ops::Activation>(k), v), definition(static_cast<ops::Activation>(k), v),
                  1e-12 * (1 + std::fabs(v)))
          << k << " " << v;
}

TEST(VectorOps, ActivationsMatchDefinitionsOnEveryIsa) {
  for_each_isa([](const std::string& isa) {
    for (DType dtype : kDTypes)
      for (int64_t w : kWidths) {
        const Tensor x = random_tensor({3, w}, 3, dtype, 12.0f);
        const std::vector<double> xv = values(x);
        for (int k = 0; k < 6; ++k) {
          const auto kind = static_cast<ops::Activation>(k);
          std::vector<double> want(xv.size());
          for (std::size_t i = 0; i < xv.size(); ++i) want[i] = definition(kind, xv[i]);
          const std::string what = isa + " " + std::string(dtype_name(dtype)) + " w=" + std::to_string(w) + " kind " + std::to_string(k);
          expect_close(ops::activation(x, kind), want, dtype, what);
          if (w > 1) expect_close(ops::activation(strided_copy_of(x), kind), want, dtype, what + " strided");
        }
      }
  });
}

TEST(VectorOps, ActivationsAtTheExtremes) {
  const Tensor x = Tensor::from_vector<float>({-100.0f, -88.0f, -20.0f, -6.0f, -1e-4f, 0.0f, 1e-4f, 6.0f, 20.0f, 88.0f, 100.0f}, {11});
  const std::vector<double> xv = values(x);
  for (int k = 0; k < 6; ++k) {
    const auto kind = static_cast<ops::Activation>(k);
    std::vector<double> want(xv.size());
    for (std::size_t i = 0; i < xv.size(); ++i) want[i] = definition(kind, xv[i]);
    expect_close(ops::activation(x, kind), want, DType::f32, "extremes kind " + std::to_string(k));
  }
}

TEST(VectorOps, SoftmaxMatchesDefinitionAndIsStable) {
  for_each_isa([](const std::string& isa) {
    for (DType dtype : kDTypes)
      for (int64_t w : kWidths) {
        Tensor x = random_tensor({5, w}, 4, DType::f32, 20.0f);
        x.mutable_data<float>()[0] = 1000.0f;  // would overflow exp() without the max shift
        if (dtype == DType::bf16) x = ops::cast(x, DType::bf16);
        const std::vector<double> xv = values(x);
        std::vector<double> want(xv.size());
        for (int64_t r = 0; r < 5; ++r) {
          double max = -1e300, sum = 0;
          for (int64_t i = 0; i < w; ++i) max = std::max(max, xv[r * w + i]);
          for (int64_t i = 0; i < w; ++i) sum += std::exp(xv[r * w + i] - max);
          for (int64_t i = 0; i < w; ++i) want[r * w + i] = std::exp(xv[r * w + i] - max) / sum;
        }
        const std::string what = isa + " " + std::string(dtype_name(dtype)) + " w=" + std::to_string(w);
        expect_close(ops::softmax(x), want, dtype, what);
        if (w > 1) expect_close(ops::softmax(strided_copy_of(x)), want, dtype, what + " strided");
      }
  });
  // A bf16 row longer than the kernel's stack buffer takes the recomputing path.
  const Tensor long_row = random_tensor({2, 5000}, 9, DType::bf16, 5.0f);
  const std::vector<double> xv = values(long_row);
  std::vector<double> want(xv.size());
  for (int64_t r = 0; r < 2; ++r) {
    double max = -1e300, sum = 0;
    for (int64_t i = 0; i < 5000; ++i) max = std::max(max, xv[r * 5000 + i]);
    for (int64_t i = 0; i < 5000; ++i) sum += std::exp(xv[r * 5000 + i] - max);
    for (int64_t i = 0; i < 5000; ++i) want[r * 5000 + i] = std::exp(xv[r * 5000 + i] - max) / sum;
  }
  expect_close(ops::softmax(long_row), want, DType::bf16, "bf16 row of 5000");
}

// a op b by NumPy broadcasting, in double, from the logical values of both.
std::vector<double> broadcast_reference(const Shape& sa, const std::vector<double>& a, const Shape& sb, const std::vector<double>& b,
                                        const std::function<double(double, double)>& op, Shape& out_shape) {
  const std::size_t rank = std::max(sa.size(), sb.size());
  Shape pa(rank, 1), pb(rank, 1);
  std::copy(sa.begin(), sa.end(), pa.begin() + static_cast<std::ptrdiff_t>(rank - sa.size()));
  std::copy(sb.begin(), sb.end(), pb.begin() + static_cast<std::ptrdiff_t>(rank - sb.size()));
  out_shape.assign(rank, 1);
  for (std::size_t d = 0; d < rank; ++d) out_shape[d] = std::max(pa[d], pb[d]);
  std::vector<double> out(static_cast<std::size_t>(shape_numel(out_shape)));
  std::vector<int64_t> index(rank, 0);
  for (std::size_t i = 0; i < out.size(); ++i) {
    int64_t ia = 0, ib = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      ia = ia * pa[d] + (pa[d] == 1 ? 0 : index[d]);
      ib = ib * pb[d] + (pb[d] == 1 ? 0 : index[d]);
    }
    out[i] = op(a[static_cast<std::size_t>(ia)], b[static_cast<std::size_t>(ib)]);
    for (int64_t d = static_cast<int64_t>(rank) - 1; d >= 0; --d) {
      if (++index[d] < out_shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

TEST(VectorOps, ArithmeticBroadcastsLikeNumPy) {
  const std::pair<Shape, Shape> cases[] = {{{7, 17}, {7, 17}},   {{7, 17}, {17}},     {{7, 17}, {7, 1}}, {{1, 17}, {7, 1}},
                                           {{3, 5, 129}, {129}}, {{3, 1, 7}, {5, 1}}, {{1}, {3, 7}},     {{2, 3, 4, 5}, {3, 1, 5}},
                                           {{129}, {1}},         {{1, 1}, {1}}};
  using Fn = Tensor (*)(const Tensor&, const Tensor&, const Stream&);
  const std::tuple<const char*, Fn, std::function<double(double, double)>> ops_list[] = {
      {"add", ops::add, [](double x, double y) { return x + y; }},
      {"sub", ops::sub, [](double x, double y) { return x - y; }},
      {"mul", ops::mul, [](double x, double y) { return x * y; }},
      {"div", ops::div, [](double x, double y) { return x / y; }}};
  for_each_isa([&](const std::string& isa) {
    for (DType dtype : kDTypes)
      for (const auto& [sa, sb] : cases) {
        const Tensor a = random_tensor(sa, 11, dtype);
        // Divisors kept away from zero: |b| in [0.5, 3.5].
        std::vector<double> bv = values(random_tensor(sb, 12));
        std::vector<float> bf(bv.size());
        for (std::size_t i = 0; i < bv.size(); ++i) bf[i] = static_cast<float>(bv[i] >= 0 ? bv[i] + 0.5 : bv[i] - 0.5);
        Tensor b_safe = Tensor::from_vector(bf, sb);
        if (dtype == DType::bf16) b_safe = ops::cast(b_safe, DType::bf16);
        bv = values(b_safe);
        for (const auto& [name, fn, def] : ops_list) {
          Shape out_shape;
          const std::vector<double> want = broadcast_reference(sa, values(a), sb, bv, def, out_shape);
          const std::string what =
              isa + " " + name + " " + std::string(dtype_name(dtype)) + " " + shape_to_string(sa) + " " + shape_to_string(sb);
          const Tensor y = fn(a, b_safe, default_device().default_stream());
          EXPECT_EQ(y.shape(), out_shape) << what;
          expect_close(y, want, dtype, what);
          if (sa.size() >= 2 && sa.front() > 1)
            expect_close(fn(strided_copy_of(a), b_safe, default_device().default_stream()), want, dtype, what + " strided a");
        }
      }
  });
  // A sliced (offset, strided) operand.
  const Tensor base = random_tensor({9, 20}, 14);
  const Tensor a = base.slice(0, 1, 8).slice(1, 2, 19, 2);  // [7, 9]
  const Tensor b = random_tensor({9}, 15);
  Shape out_shape;
  const std::vector<double> want = broadcast_reference(
      {7, 9}, values(a), {9}, values(b), [](double x, double y) { return x * y; }, out_shape);
  expect_close(ops::mul(a, b), want, DType::f32, "sliced a");
}

TEST(VectorOps, MulsAdd) {
  for (DType dtype : kDTypes)
    for (int64_t w : kWidths) {
      const Tensor x = random_tensor({3, w}, 21, dtype), y = random_tensor({3, w}, 22, dtype);
      const std::vector<double> xv = values(x), yv = values(y);
      std::vector<double> want(xv.size());
      for (std::size_t i = 0; i < xv.size(); ++i) want[i] = xv[i] * 0.375 + yv[i];
      const std::string what = std::string(dtype_name(dtype)) + " w=" + std::to_string(w);
      expect_close(ops::muls_add(x, y, 0.375f), want, dtype, what);
      if (w > 1) expect_close(ops::muls_add(strided_copy_of(x), y, 0.375f), want, dtype, what + " strided");
    }
  const std::string msg = message_of([] { ops::muls_add(random_tensor({3, 4}, 1), random_tensor({4}, 2), 2.0f); });
  EXPECT_NE(msg.find("muls_add: x and y must have the same shape, got x [3, 4] and y [4]"), std::string::npos) << msg;
}

TEST(VectorOps, CastRoundsToNearestEvenAndRoundTrips) {
  for_each_isa([](const std::string& isa) {
    for (int64_t w : kWidths) {
      Tensor x = random_tensor({3, w}, 31, DType::f32, 100.0f);
      float* xd = x.mutable_data<float>();
      xd[0] = std::bit_cast<float>(0x3f808000u);             // exactly halfway between two bf16: ties to even (down)
      if (w > 1) xd[1] = std::bit_cast<float>(0x3f818000u);  // halfway, rounds up to even
      const Tensor b = ops::cast(x, DType::bf16);
      const Tensor h = ops::cast(x, DType::f16);
      ASSERT_EQ(b.dtype(), DType::bf16);
      for (int64_t i = 0; i < x.numel(); ++i) {
        // Round to nearest even on the bits, written out here.
        const uint32_t bits = std::bit_cast<uint32_t>(xd[i]);
        const uint32_t lower = bits & 0xffffu, upper = bits >> 16;
        const uint32_t want = lower > 0x8000u || (lower == 0x8000u && (upper & 1u)) ? upper + 1 : upper;
        ASSERT_EQ(b.data<uint16_t>()[i], want) << isa << " at " << i;
        ASSERT_EQ(h.data<uint16_t>()[i], f32_to_f16(xd[i])) << isa << " at " << i;
      }
      // bf16 -> f32 and f16 -> f32 are exact; bf16 <-> f16 goes through f32.
      expect_close(ops::cast(b, DType::f32), values(b), DType::f32, isa + " bf16->f32");
      expect_close(ops::cast(h, DType::f32), values(h), DType::f32, isa + " f16->f32");
      const Tensor hb = ops::cast(h, DType::bf16);
      for (int64_t i = 0; i < x.numel(); ++i)
        ASSERT_EQ(hb.data<uint16_t>()[i], f32_to_bf16(f16_to_f32(h.data<uint16_t>()[i]))) << isa << " f16->bf16";
      const Tensor bh = ops::cast(b, DType::f16);
      for (int64_t i = 0; i < x.numel(); ++i)
        ASSERT_EQ(bh.data<uint16_t>()[i], f32_to_f16(bf16_to_f32(b.data<uint16_t>()[i]))) << isa << " bf16->f16";
      if (w > 1) expect_close(ops::cast(strided_copy_of(x), DType::bf16), values(b), DType::bf16, isa + " strided");
    }
  });
  const Tensor nan = Tensor::from_vector<float>({std::nanf(""), -INFINITY, 3.4e38f}, {3});
  const Tensor b = ops::cast(nan, DType::bf16);
  EXPECT_TRUE(std::isnan(bf16_to_f32(b.data<uint16_t>()[0])));
  EXPECT_EQ(bf16_to_f32(b.data<uint16_t>()[1]), -INFINITY);
  EXPECT_EQ(b.data<uint16_t>()[2], f32_to_bf16(3.4e38f));
  const std::string msg = message_of([] { ops::cast(Tensor::zeros({2}, DType::i32), DType::f32); });
  EXPECT_NE(msg.find("cast: converts between f32, bf16 and f16, got i32 [2] to f32"), std::string::npos) << msg;
}

TEST(VectorOps, ContiguousCopiesStridedViewsOnly) {
  const Tensor x = random_tensor({5, 7, 3}, 41);
  EXPECT_TRUE(ops::contiguous(x).shares_storage_with(x));
  for (const Tensor& view : {x.permute({2, 0, 1}), x.slice(1, 1, 7, 3), x.select(2, 1), x.transpose(0, 1)}) {
    const Tensor c = ops::contiguous(view);
    EXPECT_TRUE(c.is_contiguous());
    EXPECT_EQ(c.shape(), view.shape());
    EXPECT_EQ(values(c), values(view));
  }
  const Tensor i = Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3}).transpose(0, 1);
  EXPECT_EQ(ops::contiguous(i).contiguous().data<int32_t>()[1], 4);
  const Tensor b = random_tensor({4, 9}, 42, DType::bf16).transpose(0, 1);
  EXPECT_EQ(values(ops::contiguous(b)), values(b));
}

TEST(VectorOps, ErrorsNameTheOpAndWhatWasExpected) {
  const Tensor x = random_tensor({4, 8}, 5);
  std::string msg = message_of([&] { ops::add(x, random_tensor({4, 8}, 6, DType::bf16)); });
  EXPECT_NE(msg.find("add: a and b must have the same dtype, got a f32 [4, 8] and b bf16 [4, 8]"), std::string::npos) << msg;
  msg = message_of([&] { ops::mul(x, random_tensor({3}, 6)); });
  EXPECT_NE(msg.find("mul: shapes [4, 8] and [3] do not broadcast"), std::string::npos) << msg;
  msg = message_of([&] { ops::softmax(Tensor::zeros({2, 2}, DType::i32)); });
  EXPECT_NE(msg.find("softmax: x must be f32 or bf16, got i32 [2, 2]"), std::string::npos) << msg;
  msg = message_of([&] { ops::activation(Tensor::zeros({2}, DType::f16), ops::Activation::relu); });
  EXPECT_NE(msg.find("relu: x must be f32 or bf16, got f16 [2]"), std::string::npos) << msg;
  msg = message_of([&] { ops::div(x, Tensor()); });
  EXPECT_NE(msg.find("div: b is undefined"), std::string::npos) << msg;
}

TEST(VectorOps, UnknownIsaIsAnError) {
  setenv("CUBEVEC_VECTOR_ISA", "sse9", 1);
  const std::string msg = message_of([] { ops::softmax(random_tensor({2, 2}, 1)); });
  unsetenv("CUBEVEC_VECTOR_ISA");
  EXPECT_NE(msg.find("CUBEVEC_VECTOR_ISA=sse9: unknown ISA (expected one of: avx512, avx2, portable)"), std::string::npos) << msg;
}

}  // namespace vector_ops_test
}  // namespace cubevec
