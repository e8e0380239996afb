// The int8 kernels against plain loops: the u8 x s8 GEMM of every ISA this CPU has (exact integer
// sums, odd shapes, every epilogue), the activation quantization (per token and static, rounding
// half to even, clamping, SmoothQuant, non-finite rows), and the weight-only int8 float GEMM.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "ops/gemm.h"
#include "ops/gemm/int8.h"
#include "ops/quantized.h"
#include "ops/vector_ops.h"
#include "tensor/half.h"

#include "common/amx_model_scope.h"
#include "common/tensor_testing.h"
#include "common/vector_isa.h"

namespace cubevec {
namespace int8_gemm_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using ops::gemm::Int8Isa;

std::vector<Int8Isa> supported_isas() {
  std::vector<Int8Isa> out;
  for (Int8Isa isa : {Int8Isa::amx, Int8Isa::avx512_vnni, Int8Isa::avx_vnni, Int8Isa::avx2, Int8Isa::portable})
    if (ops::gemm::int8_isa_supported(isa)) out.push_back(isa);
  return out;
}

struct Shape3 {
  int64_t m, n, k;
};
// Edges of every kernel's tiles (AMX: 32 x 32, K in blocks of 64), K past a block, several blocks;
// long K (several thousand, not a multiple of any block).
const Shape3 kShapes[] = {{1, 1, 1},     {7, 17, 13},  {29, 33, 64},   {64, 70, 129},  {15, 3, 515},
                          {200, 48, 96}, {33, 65, 65}, {97, 130, 320}, {70, 40, 2000}, {33, 35, 3333}};

std::vector<uint8_t> random_u8(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) x = static_cast<uint8_t>(rng() % 256);
  return v;
}
std::vector<int8_t> random_s8(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<int8_t> v(n);
  for (auto& x : v) x = static_cast<int8_t>(static_cast<int>(rng() % 256) - 128);
  return v;
}

TEST(Int8Gemm, ExactIntegerSumsOnEveryIsa) {
  const cubevec::testing::AmxModelWhereNoAmx amx_tiles;  // AMX on the tile model where the CPU has none
  for (Int8Isa isa : supported_isas())
    for (const Shape3& s : kShapes) {
      SCOPED_TRACE(std::string(ops::gemm::int8_isa_name(isa)) + " " + std::to_string(s.m) + "x" + std::to_string(s.n) + "x" +
                   std::to_string(s.k));
      // The activations are padded to the packing's K; whatever the padding holds adds nothing.
      const int64_t kp = 4 * ops::gemm::int8_k_quads(s.k, isa);
      const std::vector<uint8_t> a = random_u8(static_cast<std::size_t>(s.m * kp), 1);
      const std::vector<int8_t> w = random_s8(static_cast<std::size_t>(s.n * s.k), 2);
      const auto packed = ops::gemm::pack_int8_weight(w.data(), s.n, s.k, s.k, isa);
      ASSERT_EQ(4 * packed->k_quads, kp);
      std::vector<float> c(static_cast<std::size_t>(s.m * s.n), -1.0f);
      ops::gemm::Int8Problem p;
      p.m = s.m, p.n = s.n, p.a = a.data(), p.lda = kp, p.b = packed.get(), p.c = c.data(), p.ldc = s.n;
      ops::gemm::gemm_int8(p, 2);
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = 0; j < s.n; ++j) {
          int64_t acc = 0;
          for (int64_t k = 0; k < s.k; ++k)
            acc += (static_cast<int64_t>(a[static_cast<std::size_t>(i * kp + k)]) - 128) * w[static_cast<std::size_t>(j * s.k + k)];
          ASSERT_EQ(c[static_cast<std::size_t>(i * s.n + j)], static_cast<float>(acc)) << i << "," << j;
        }
    }
}

TEST(Int8Gemm, EveryEpilogue) {
  const cubevec::testing::AmxModelWhereNoAmx amx_tiles;  // AMX on the tile model where the CPU has none
  const int64_t m = 23, n = 37, k = 45, kp = 64;         // kp: the widest padding (AMX's 64)
  const std::vector<uint8_t> a = random_u8(static_cast<std::size_t>(m * kp), 3);
  const std::vector<int8_t> w = random_s8(static_cast<std::size_t>(n * k), 4);
  std::vector<int32_t> int_bias(static_cast<std::size_t>(n));
  std::vector<float> row(static_cast<std::size_t>(m)), col(static_cast<std::size_t>(n)), bias(static_cast<std::size_t>(n)),
      gate(static_cast<std::size_t>(n)), residual(static_cast<std::size_t>(m * n));
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : int_bias) v = static_cast<int32_t>(rng() % 2001) - 1000;
  for (auto& v : row) v = 0.001f + std::abs(u(rng)) * 0.01f;
  for (auto& v : col) v = 0.001f + std::abs(u(rng)) * 0.01f;
  for (auto& v : bias) v = u(rng);
  for (auto& v : gate) v = u(rng);
  for (auto& v : residual) v = u(rng);
  for (Int8Isa isa : supported_isas())
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE(std::string(ops::gemm::int8_isa_name(isa)) + " variant " + std::to_string(variant));
      const auto packed = ops::gemm::pack_int8_weight(w.data(), n, k, k, isa);
      std::vector<float> c(static_cast<std::size_t>(m * n));
      std::vector<uint16_t> c_bf16(static_cast<std::size_t>(m * n));
      ops::gemm::Int8Problem p;
      p.m = m, p.n = n, p.a = a.data(), p.lda = kp, p.b = packed.get(), p.c = c.data(), p.ldc = n;
      auto& e = p.epilogue;
      e.int_bias = int_bias.data(), e.row_scale = row.data(), e.col_scale = col.data(), e.bias = bias.data();
      if (variant >= 1) e.rest.activation = ops::gemm::Activation::gelu_tanh;
      if (variant >= 2) e.rest.residual = residual.data(), e.rest.ld_residual = n, e.rest.gate = gate.data();
      if (variant == 3) e.rest.out_bf16 = c_bf16.data(), e.rest.ld_out = n;
      ops::gemm::gemm_int8(p, 2);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          int64_t acc = int_bias[static_cast<std::size_t>(j)];
          for (int64_t q = 0; q < k; ++q)
            acc += (static_cast<int64_t>(a[static_cast<std::size_t>(i * kp + q)]) - 128) * w[static_cast<std::size_t>(j * k + q)];
          double y = static_cast<double>(acc) * row[static_cast<std::size_t>(i)] * col[static_cast<std::size_t>(j)] +
                     bias[static_cast<std::size_t>(j)];
          if (variant >= 1) y = ops::activation_reference(ops::Activation::gelu_tanh, y);
          if (variant >= 2) y = residual[static_cast<std::size_t>(i * n + j)] + gate[static_cast<std::size_t>(j)] * y;
          const double got =
              variant == 3 ? bf16_to_f32(c_bf16[static_cast<std::size_t>(i * n + j)]) : c[static_cast<std::size_t>(i * n + j)];
          const double tol = variant == 3 ? std::abs(y) / 128 + 1e-6 : 1e-5 * std::max(1.0, std::abs(y));
          ASSERT_NEAR(got, y, tol) << i << "," << j;
        }
    }
}

TEST(Int8Quantize, PerTokenSymmetricWithHalfEvenRounding) {
  const int64_t m = 5, k = 21;
  std::vector<float> x(static_cast<std::size_t>(m * k));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-3, 3);
  for (auto& v : x) v = u(rng);
  // Row 1: exact ties after scaling (max 127 -> scale 1): 2.5 -> 2, 3.5 -> 4, -0.5 -> -0.
  for (int64_t j = 0; j < k; ++j) x[static_cast<std::size_t>(k + j)] = 0.0f;
  x[static_cast<std::size_t>(k + 0)] = 127.0f, x[static_cast<std::size_t>(k + 1)] = 2.5f, x[static_cast<std::size_t>(k + 2)] = 3.5f,
                                 x[static_cast<std::size_t>(k + 3)] = -0.5f;
  for (int64_t j = 0; j < k; ++j) x[static_cast<std::size_t>(2 * k + j)] = 0.0f;    // all zero
  x[static_cast<std::size_t>(3 * k + 4)] = std::numeric_limits<float>::infinity();  // non-finite
  const Tensor mul = random_tensor({k}, 9, DType::f32, 1.0f);
  for_each_vector_isa([&](const std::string& isa) {
    SCOPED_TRACE(isa);
    for (bool smooth : {false, true}) {
      const Tensor xt = Tensor::from_vector(x, {m, k});
      const ops::QuantizedActivations q = ops::quantize_activations(xt, 24, {true, 1, 0, smooth ? mul : Tensor()});
      ASSERT_EQ(q.data.shape(), (Shape{m, 24}));
      const uint8_t* d = q.data.data<uint8_t>();
      const float* s = q.row_scale.data<float>();
      for (int64_t i = 0; i < m; ++i) {
        std::vector<float> v(static_cast<std::size_t>(k));
        float amax = 0;
        bool finite = true;
        for (int64_t j = 0; j < k; ++j) {
          v[static_cast<std::size_t>(j)] = x[static_cast<std::size_t>(i * k + j)] * (smooth ? mul.data<float>()[j] : 1.0f);
          finite = finite && std::isfinite(v[static_cast<std::size_t>(j)]);
          amax = std::max(amax, std::abs(v[static_cast<std::size_t>(j)]));
        }
        if (!finite) {
          EXPECT_TRUE(std::isnan(s[i])) << "row " << i;
          continue;
        }
        const float scale = amax == 0 ? 1.0f : amax / 127.0f;
        EXPECT_EQ(s[i], scale) << "row " << i;
        for (int64_t j = 0; j < k; ++j) {
          const float want = std::nearbyint(v[static_cast<std::size_t>(j)] / scale);
          ASSERT_EQ(static_cast<int>(d[i * 24 + j]) - 128, static_cast<int>(want)) << i << "," << j;
        }
        for (int64_t j = k; j < 24; ++j) ASSERT_EQ(d[i * 24 + j], 128);
      }
    }
  });
  const uint8_t* d = ops::quantize_activations(Tensor::from_vector(x, {m, k}), 24, {}).data.data<uint8_t>();
  EXPECT_EQ(static_cast<int>(d[24 + 1]) - 128, 2);
  EXPECT_EQ(static_cast<int>(d[24 + 2]) - 128, 4);
  EXPECT_EQ(static_cast<int>(d[24 + 3]) - 128, 0);
}

TEST(Int8Quantize, StaticWithOffsetAndSaturation) {
  // scale 0.5, offset -3: q = clamp(rint(x / 0.5 - 3), -128, 127).
  const std::vector<float> x = {0.0f, 1.25f, 1.75f, -100.0f, 100.0f, 0.25f, -1.0f, 63.0f};
  const auto q = ops::quantize_activations(Tensor::from_vector(x, {2, 4}), 4, {false, 0.5f, -3.0f, {}});
  const uint8_t* d = q.data.data<uint8_t>();
  const int want[] = {-3, 0 /* 2.5 - 3 = -0.5 -> -0 */, 0 /* 3.5 - 3 = 0.5 -> 0 */, -128, 127, -2 /* 0.5 - 3 = -2.5 -> -2 */, -5, 123};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(static_cast<int>(d[i]) - 128, want[i]) << i;
  EXPECT_EQ(q.row_scale.data<float>()[0], 1.0f);
  const std::vector<float> bad = {1.0f, std::numeric_limits<float>::quiet_NaN(), 0.0f, 0.0f};
  EXPECT_TRUE(
      std::isnan(ops::quantize_activations(Tensor::from_vector(bad, {1, 4}), 4, {false, 0.5f, 0.0f, {}}).row_scale.data<float>()[0]));
  EXPECT_NE(message_of([&] {
              ops::quantize_activations(Tensor::from_vector(x, {2, 4}), 4, {false, 0.0f, 0.0f, {}});
            }).find("the static scale must be positive"),
            std::string::npos);
  EXPECT_NE(message_of([&] { ops::quantize_activations(Tensor::from_vector(x, {2, 4}), 6, {}); }).find("multiple of 4"), std::string::npos);
}

TEST(Int8Quantize, MatmulInt8EndToEnd) {
  const Tensor x = random_tensor({9, 30}, 11, DType::f32, 2.0f);
  std::vector<int8_t> w = random_s8(20 * 30, 12);
  const Tensor wt = Tensor::from_vector(w, {20, 30});
  const Tensor col = random_tensor({20}, 13, DType::f32, 0.01f), bias = random_tensor({20}, 14, DType::f32, 1.0f);
  const auto packed = ops::pack_int8_weight(wt);
  const int64_t kp = 4 * packed->k_quads;  // 32, or 64 for AMX's tiles
  const ops::QuantizedActivations q = ops::quantize_activations(x, kp, {});
  ops::Int8MatmulOptions o;
  o.col_scale = col, o.bias = bias;
  for (DType out : {DType::f32, DType::bf16}) {
    o.out = out;
    const Tensor y = ops::matmul_int8(q, packed, o);
    const std::vector<double> got = values(y);
    for (int64_t i = 0; i < 9; ++i)
      for (int64_t j = 0; j < 20; ++j) {
        double acc = 0;
        for (int64_t kk = 0; kk < 30; ++kk)
          acc += (static_cast<double>(q.data.data<uint8_t>()[i * kp + kk]) - 128) * w[static_cast<std::size_t>(j * 30 + kk)];
        const double want = acc * q.row_scale.data<float>()[i] * col.data<float>()[j] + bias.data<float>()[j];
        ASSERT_NEAR(got[static_cast<std::size_t>(i * 20 + j)], want,
                    out == DType::bf16 ? std::abs(want) / 128 + 1e-6 : 1e-5 * std::max(1.0, std::abs(want)));
      }
  }
  EXPECT_NE(message_of([&] { ops::matmul_int8(ops::quantize_activations(x, kp + 4, {}), packed, o); }).find("quantized for K = 30"),
            std::string::npos);
}

// matmul_int8_quantizing quantizes each block of rows as the GEMM packs A: the same bits as the
// separate quantize_activations pass followed by matmul_int8, for every int8 kernel this CPU has,
// dynamic and static (with SmoothQuant), f32 and bf16 activations, a strided view, a row with a
// NaN, row counts that split into several A blocks and parts, and every epilogue.
TEST(Int8Quantize, FusedQuantizeOnPackEqualsTheSeparatePassBitForBit) {
  const cubevec::testing::AmxModelWhereNoAmx amx_tiles;  // AMX on the tile model where the CPU has none
  const int64_t n = 70, k = 150;
  const std::vector<int8_t> w = random_s8(static_cast<std::size_t>(n * k), 31);
  const Tensor col = random_tensor({n}, 32, DType::f32, 0.01f, 0.02f), bias = random_tensor({n}, 33, DType::f32, 1.0f);
  const Tensor mul = random_tensor({k}, 34, DType::f32, 0.5f, 1.0f), gate = random_tensor({n}, 35, DType::f32, 1.0f);
  const Tensor int_bias = Tensor::from_vector(std::vector<int32_t>(static_cast<std::size_t>(n), -37), {n});
  for (Int8Isa isa : supported_isas())
    for (const int64_t m : {int64_t{1}, int64_t{45}, int64_t{700}})
      for (int variant = 0; variant < 4; ++variant) {
        SCOPED_TRACE(std::string(ops::gemm::int8_isa_name(isa)) + " m " + std::to_string(m) + " variant " + std::to_string(variant));
        const ops::PackedInt8Weight packed = ops::gemm::pack_int8_weight(w.data(), n, k, k, isa);
        // variant 0: dynamic f32; 1: dynamic bf16 through a transposed view, smoothed; 2: static
        // with a bias and a NaN row; 3: static smoothed, GELU, gated residual, bf16 out.
        Tensor x = random_tensor({m, k}, 36 + static_cast<unsigned>(variant), DType::f32, 2.0f);
        if (variant == 1) x = random_tensor({k, m}, 40, DType::bf16, 2.0f).transpose(0, 1);
        if (variant == 2 && m > 1) x.mutable_data<float>()[k + 3] = std::numeric_limits<float>::quiet_NaN();
        ops::ActivationQuant q;
        q.dynamic = variant < 2;
        q.scale = 0.03f, q.offset = variant == 3 ? 2.0f : 0.0f;
        if (variant % 2 == 1) q.mul_scale = mul;
        ops::Int8MatmulOptions o;
        o.col_scale = col;
        if (variant >= 2) o.int_bias = int_bias, o.bias = bias;
        if (variant == 3) {
          o.activation = ops::GemmActivation::gelu_tanh;
          o.residual = random_tensor({m, n}, 41, DType::f32, 1.0f);
          o.gate = gate;
          o.out = DType::bf16;
        }
        const Tensor separate = ops::matmul_int8(ops::quantize_activations(x, 4 * packed->k_quads, q), packed, o);
        const Tensor fused = ops::matmul_int8_quantizing(x, q, packed, o);
        ASSERT_EQ(fused.shape(), separate.shape());
        const std::vector<double> a = values(separate), b = values(fused);
        for (std::size_t i = 0; i < a.size(); ++i) {
          if (std::isnan(a[i]) && std::isnan(b[i])) continue;  // the NaN row: NaN both ways
          ASSERT_EQ(a[i], b[i]) << "element " << i;
        }
      }
  // [..., K] keeps its leading dimensions; a K the weight was not packed for is refused.
  const ops::PackedInt8Weight packed = ops::gemm::pack_int8_weight(w.data(), n, k, k, ops::gemm::best_int8_isa());
  EXPECT_EQ(ops::matmul_int8_quantizing(random_tensor({2, 3, k}, 50), {}, packed).shape(), (Shape{2, 3, n}));
  EXPECT_NE(message_of([&] {
              ops::matmul_int8_quantizing(random_tensor({2, k + 1}, 51), {}, packed);
            }).find("x has K = 151, the weight 150"),
            std::string::npos);
}

TEST(Int8WeightGemm, WeightOnlyMatchesTheDequantizedProduct) {
  const int64_t m = 13, n = 29, k = 41;
  const Tensor x = random_tensor({m, k}, 21, DType::f32, 1.0f);
  const std::vector<int8_t> w = random_s8(static_cast<std::size_t>(n * k), 22);
  const Tensor wt = Tensor::from_vector(w, {n, k}), scale = random_tensor({n}, 23, DType::f32, 0.02f);
  const Tensor bias = random_tensor({n}, 24, DType::f32, 1.0f);
  for (DType compute : {DType::f32, DType::bf16}) {
    ops::MatmulOptions o{.bias = bias, .b_is_weight = true, .compute = compute};
    o.b_scale = scale;
    const std::vector<double> got = values(ops::matmul(x, wt, o));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double want = bias.data<float>()[j];
        for (int64_t q = 0; q < k; ++q) {
          float wv = static_cast<float>(w[static_cast<std::size_t>(j * k + q)]) * scale.data<float>()[j];
          float xv = x.data<float>()[i * k + q];
          if (compute == DType::bf16) wv = bf16_to_f32(f32_to_bf16(wv)), xv = bf16_to_f32(f32_to_bf16(xv));
          want += static_cast<double>(xv) * wv;
        }
        ASSERT_NEAR(got[static_cast<std::size_t>(i * n + j)], want,
                    1e-5 * std::max(1.0, std::abs(want)) * std::sqrt(static_cast<double>(k)));
      }
  }
  EXPECT_NE(message_of([&] { ops::matmul(x, wt, {.b_is_weight = true}); }).find("needs b_scale"), std::string::npos);
}

}  // namespace int8_gemm_test
}  // namespace cubevec
