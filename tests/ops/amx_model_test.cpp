// The AMX tile model (ops/gemm/amx_model.h) against the instructions' definitions written out as
// plain loops here: shapes smaller than the full tiles, the s32 wrap-around, bf16 denormals treated
// as zero on input and flushed on output; misuse as a named error where the CPU raises #UD or #GP;
// and, where the CPU has AMX, the model against the CPU's own tiles through the same kernels.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "ops/gemm/amx_model.h"
#include "ops/gemm/driver.h"
#include "ops/gemm/int8.h"
#include "ops/gemm/int8_kernels.h"
#include "ops/gemm/microkernel_bf16.h"

#include "common/tensor_testing.h"

namespace amx_model_test {  // named after the file: unity batches never mix two files' helpers

namespace model = cubevec::ops::gemm::amx_model;

// A palette-1 configuration with the given rows and bytes per row for tiles 0-7.
struct Shape {
  int rows, colsb;
};
void configure(const std::vector<Shape>& shapes, int palette = 1) {
  unsigned char config[64] = {};
  config[0] = static_cast<unsigned char>(palette);
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    const auto colsb = static_cast<uint16_t>(shapes[t].colsb);
    std::memcpy(config + 16 + 2 * t, &colsb, 2);
    config[48 + t] = static_cast<unsigned char>(shapes[t].rows);
  }
  model::load_config(config);
}

// Each test drives the tiles of a thread of its own: the kernels configure a thread's tiles once
// and trust them after, so the tests' odd shapes must not stay behind on the main thread.
void in_fresh_thread(const std::function<void()>& body) { std::thread(body).join(); }

using cubevec::testing::message_of;

uint16_t bf16_bits(float x) { return static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16); }  // exact for the values below
float from_bf16(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

TEST(AmxModel, ByteProductsAreTheInstructionsQuadSumsWrappingAt32Bits) {
  in_fresh_thread([] {
    // C 5 x 3 s32 (12 bytes), A 5 x 2 quads (8 bytes), B 2 rows x 3 quads: smaller than a full tile.
    configure({{5, 12}, {5, 8}, {2, 12}});
    std::mt19937 rng(3);
    uint8_t a[5][8];
    int8_t b[2][12];
    int32_t c[5][3];
    for (auto& row : a)
      for (auto& v : row) v = static_cast<uint8_t>(rng());
    for (auto& row : b)
      for (auto& v : row) v = static_cast<int8_t>(rng());
    for (int m = 0; m < 5; ++m)
      for (int n = 0; n < 3; ++n) c[m][n] = m == 0 ? std::numeric_limits<int32_t>::max() - n : static_cast<int32_t>(rng() % 1000);
    for (const bool signed_a : {false, true}) {
      model::load(0, c, sizeof c[0]);
      model::load(1, a, sizeof a[0]);
      model::load(2, b, sizeof b[0]);
      if (signed_a) model::dp_bssd(0, 1, 2);
      else model::dp_busd(0, 1, 2);
      int32_t got[5][3];
      model::store(0, got, sizeof got[0]);
      for (int m = 0; m < 5; ++m)
        for (int n = 0; n < 3; ++n) {
          int64_t sum = c[m][n];
          for (int k = 0; k < 2; ++k)
            for (int i = 0; i < 4; ++i) {
              const int64_t av = signed_a ? static_cast<int8_t>(a[m][4 * k + i]) : a[m][4 * k + i];
              sum += av * b[k][4 * n + i];
            }
          // Two's complement wrap-around, as the CPU's s32 adds (row 0 starts next to INT32_MAX).
          const auto want = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(sum)));
          EXPECT_EQ(got[m][n], want) << (signed_a ? "tdpbssd" : "tdpbusd") << " at " << m << "," << n;
        }
    }
  });
}

TEST(AmxModel, Bf16ProductsSumInF32WithDenormalsZeroInAndOut) {
  in_fresh_thread([] {
    // C 3 x 2 f32, A 3 x 4 pairs (16 bytes), B 4 rows x 2 pairs. Small integers: every sum is exact,
    // so the result is the exact dot product whatever the order.
    configure({{3, 8}, {3, 16}, {4, 8}});
    uint16_t a[3][8], b[4][4];
    float c[3][2];
    for (int m = 0; m < 3; ++m)
      for (int i = 0; i < 8; ++i) a[m][i] = bf16_bits(static_cast<float>((m * 8 + i) % 7 - 3));
    for (int k = 0; k < 4; ++k)
      for (int i = 0; i < 4; ++i) b[k][i] = bf16_bits(static_cast<float>((k * 4 + i) % 5 - 2));
    for (int m = 0; m < 3; ++m)
      for (int n = 0; n < 2; ++n) c[m][n] = static_cast<float>(10 * m + n);
    model::load(0, c, sizeof c[0]);
    model::load(1, a, sizeof a[0]);
    model::load(2, b, sizeof b[0]);
    model::dp_bf16ps(0, 1, 2);
    float got[3][2];
    model::store(0, got, sizeof got[0]);
    for (int m = 0; m < 3; ++m)
      for (int n = 0; n < 2; ++n) {
        float want = c[m][n];
        for (int k = 0; k < 4; ++k)
          for (int i = 0; i < 2; ++i) want += from_bf16(a[m][2 * k + i]) * from_bf16(b[k][2 * n + i]);
        EXPECT_EQ(got[m][n], want) << m << "," << n;
      }

    // A denormal bf16 input counts as zero; a product below f32's normal range is flushed to zero.
    configure({{1, 4}, {1, 4}, {1, 4}});
    const uint16_t denormal = 0x0001, big = bf16_bits(0x1p100f);
    const uint16_t tiny_a[2] = {denormal, bf16_bits(0x1p-100f)}, tiny_b[2] = {big, bf16_bits(0x1p-30f)};
    const float start = 0;
    model::load(0, &start, 4);
    model::load(1, tiny_a, 4);
    model::load(2, tiny_b, 4);
    model::dp_bf16ps(0, 1, 2);
    float result = -1;
    model::store(0, &result, 4);
    EXPECT_EQ(result, 0.0f) << "2^-133 x 2^100 would be 2^-33 without DAZ; 2^-130 is an f32 denormal";
  });
}

TEST(AmxModel, MisuseIsANamedErrorWhereTheCpuFaults) {
  in_fresh_thread([] {
    // A thread's tiles start unconfigured.
    std::string before_config;
    std::thread([&] { before_config = message_of([] { model::zero(0); }); }).join();
    EXPECT_NE(before_config.find("tilezero before the tile configuration was loaded"), std::string::npos) << before_config;

    configure({{16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 64}, {16, 64}});
    EXPECT_NE(message_of([] { model::dp_bf16ps(0, 4, 4); }).find("three tiles must be different"), std::string::npos);
    EXPECT_NE(message_of([] { model::zero(8); }).find("tile 8 does not exist"), std::string::npos);
    configure({{16, 64}, {16, 64}, {8, 64}});  // B has 8 rows where A's 64 bytes need 16
    EXPECT_NE(
        message_of([] { model::dp_busd(0, 1, 2); }).find("tile shapes do not agree (C 16 x 64 bytes, A 16 x 64 bytes, B 8 x 64 bytes)"),
        std::string::npos);
    EXPECT_NE(message_of([] { configure({{16, 64}}, 2); }).find("palette 2"), std::string::npos);
    EXPECT_NE(message_of([] { configure({{17, 64}}); }).find("17 rows of 64 bytes"), std::string::npos);
    EXPECT_NE(message_of([] { configure({{4, 0}}); }).find("4 rows of 0 bytes"), std::string::npos);
    // Palette 0 releases the tiles: using one again is the unconfigured fault.
    configure({}, 0);
    EXPECT_NE(message_of([] { model::zero(0); }).find("before the tile configuration"), std::string::npos);
  });
}

// The kernels on the model and on the CPU's tiles, same inputs: the int8 sums bit for bit, the
// bf16 ones within f32 rounding of the summation (the SDM fixes the order; a CPU may differ in
// its last bit). Only where the CPU has AMX.
TEST(AmxModel, MatchesTheCpusOwnTilesThroughTheKernels) {
  if (!cubevec::ops::gemm::amx_native()) GTEST_SKIP() << "no AMX on this CPU: nothing to compare the model with";
  std::mt19937 rng(11);
  constexpr int64_t kKQuads = 64, kKPairs = 64;  // several tile steps
  std::vector<uint8_t> a8(static_cast<std::size_t>(kKQuads * 32 * 4));
  std::vector<int8_t> b8(static_cast<std::size_t>(kKQuads * 32 * 4));
  for (auto& v : a8) v = static_cast<uint8_t>(rng());
  for (auto& v : b8) v = static_cast<int8_t>(rng());
  std::vector<int32_t> native8(32 * 32), model8(32 * 32);
  cubevec::ops::gemm::int8_microkernel_amx(kKQuads, a8.data(), b8.data(), native8.data(), 32);
  model::int8_microkernel_amx(kKQuads, a8.data(), b8.data(), model8.data(), 32);
  EXPECT_EQ(native8, model8);

  std::uniform_real_distribution<float> dist(-2, 2);
  std::vector<uint16_t> a16(static_cast<std::size_t>(kKPairs * 2 * 32)), b16(static_cast<std::size_t>(kKPairs * 2 * 32));
  for (auto& v : a16) v = static_cast<uint16_t>(std::bit_cast<uint32_t>(dist(rng)) >> 16);
  for (auto& v : b16) v = static_cast<uint16_t>(std::bit_cast<uint32_t>(dist(rng)) >> 16);
  std::vector<float> native16(32 * 32, 1.0f), model16(32 * 32, 1.0f);
  cubevec::ops::gemm::microkernel_bf16_amx(kKPairs, a16.data(), b16.data(), native16.data(), 32, true);
  model::microkernel_bf16_amx(kKPairs, a16.data(), b16.data(), model16.data(), 32, true);
  for (std::size_t i = 0; i < native16.size(); ++i) EXPECT_NEAR(model16[i], native16[i], 1e-5f * (1 + std::fabs(native16[i]))) << i;
}

TEST(AmxModel, SwitchingItOnNeedsAvx512Bf16) {
  const bool was_on = cubevec::ops::gemm::amx_model_on();
  if (cubevec::ops::gemm::has_bf16_dot()) {
    cubevec::ops::gemm::use_amx_model(true);
    EXPECT_TRUE(cubevec::ops::gemm::amx_ready());
    EXPECT_TRUE(cubevec::ops::gemm::int8_isa_supported(cubevec::ops::gemm::Int8Isa::amx));
  } else {
    EXPECT_NE(message_of([] { cubevec::ops::gemm::use_amx_model(true); }).find("needs AVX512-BF16"), std::string::npos);
  }
  cubevec::ops::gemm::use_amx_model(false);
  EXPECT_EQ(cubevec::ops::gemm::amx_ready(), cubevec::ops::gemm::amx_native());
  cubevec::ops::gemm::use_amx_model(was_on);
}

// A weight packed for AMX while the model was on, used after it was switched off on a CPU without
// AMX: a named error, never an illegal instruction.
TEST(AmxModel, AnAmxPackingRunWithoutTheModelOrAmxIsAnError) {
  namespace g = cubevec::ops::gemm;
  if (g::amx_native() || !g::has_bf16_dot()) GTEST_SKIP() << "needs a CPU without AMX that can run the model";
  const bool was_on = g::amx_model_on();
  const int64_t m = 3, n = 5, k = 7;
  std::vector<int8_t> w(static_cast<std::size_t>(n * k), 1);
  g::use_amx_model(true);
  const auto packed = g::pack_int8_weight(w.data(), n, k, k, g::Int8Isa::amx);
  g::use_amx_model(false);
  std::vector<uint8_t> a(static_cast<std::size_t>(m * 4 * packed->k_quads), 129);
  std::vector<float> c(static_cast<std::size_t>(m * n));
  g::Int8Problem p;
  p.m = m, p.n = n, p.a = a.data(), p.lda = 4 * packed->k_quads, p.b = packed.get(), p.c = c.data(), p.ldc = n;
  const std::string message = message_of([&] { g::gemm_int8(p, 1); });
  EXPECT_NE(message.find("gemm_int8: the weight was packed for an ISA this CPU lacks"), std::string::npos) << message;
  g::use_amx_model(was_on);
}

}  // namespace amx_model_test
