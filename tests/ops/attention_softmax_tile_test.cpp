// The online-softmax step of the AVX-512 flash tiles on its own, against exp in double: the
// accurate step (f32 flash) and the one for bf16 P (flash_bf16, flash_int8), with its whole-block
// path, writing f32 P and writing bf16 P. The flash implementations around it are tested in
// attention_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/attention/tile_kernels.h"
#include "ops/gemm/driver.h"
#include "ops/isa.h"

namespace cubevec {
namespace attention_softmax_tile_test {  // named after the file: unity batches never mix two files' helpers

// f32 to bf16, nearest even (no NaN comes here): the reference for the bf16 P.
uint16_t bf16_nearest_even(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// One softmax step of the AVX-512 tile kernels against exp in double: P, the new running max and
// sum and the factor for O, on scores spread over a wide range (to below exp's f32 range), a masked
// key, a NaN score and a -inf one (+inf under the negative scale), continuing a running state.
// Relative to exp of the f32 argument: the accurate step 2e-6; the one for bf16 P (flash_bf16,
// flash_int8) 1e-4 (its polynomial's 7.5e-5; bf16 itself rounds to 2^-9); both plus the f32
// subtraction's rounding. The step for bf16 P runs twice: writing f32 P into S (checked against
// exp), then writing bf16 P (checked against that f32 P rounded to nearest even, bit for bit, where
// both took the same path).
TEST(AttentionSoftmaxTile, StepMatchesExpInDoubleAtEachKernelsPrecision) {
  if (!ops::isa_supported(ops::Isa::avx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  using ops::attn::kBlockKeys;
  constexpr int kRows = 8;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> score(-40.0f, 12.0f);
  std::vector<float> scores(kRows * kBlockKeys, 0.0f);
  for (float& x : scores) x = score(rng);
  scores[1 * kBlockKeys + 5] = -1e4f;                                    // far below exp's range: P = 0
  scores[2 * kBlockKeys + 9] = std::numeric_limits<float>::quiet_NaN();  // a NaN score gives a NaN P
  scores[3 * kBlockKeys + 20] =
      -std::numeric_limits<float>::infinity();  // P = 0; scaled by -0.61, the row's P is NaN there and 0 elsewhere
  // Row 4: scores near the float limit (as a bias of `lowest` gives), where m log2(e) overflows.
  for (int j = 0; j < kBlockKeys; ++j) scores[4 * kBlockKeys + j] = j % 7 == 0 ? -3.0e38f : -3.2e38f;
  // Row 5: all-equal scores of 3e9, whose P is 1 (a form that scaled x and the max separately gave
  // NaN or 0 here). Row 6: scores around 2^24 after a running max from an earlier block; at this
  // size scaling rounds by up to half a unit of the exponent, which the bound below allows: the
  // row checks that P stays finite and in range.
  for (int j = 0; j < kBlockKeys; ++j) scores[5 * kBlockKeys + j] = 3.0e9f;
  for (int j = 0; j < kBlockKeys; ++j) scores[6 * kBlockKeys + j] = 16777216.0f + static_cast<float>(2 * (j % 5));
  std::vector<uint8_t> mask(kRows * kBlockKeys, 1);
  mask[0 * kBlockKeys + 3] = 0;
  const float inf = std::numeric_limits<float>::infinity();
  // Row 7: a running max far above the block's (P around 1e-23; the bf16 step's whole-block path
  // then scales in the exp: its other rows fold the scale and the max into one FMA).
  const float m_start[kRows] = {-inf, 2.0f, 50.0f, -3.0f, -inf, -inf, 0.61f * 16777226.0f, 60.0f};
  const float l_start[kRows] = {0.0f, 3.5f, 1.25f, 7.0f, 0.0f, 0.0f, 2.0f, 0.5f};
  const bool bf16_step_runs = ops::gemm::has_bf16_dot();  // it needs AVX512-BF16 (AMX CPUs have it)
  struct Kernel {
    ops::attn::SoftmaxKernel run;
    const char* name;
    double tolerance;
  };
  // A whole block without a mask and with a positive scale takes the bf16 step's shorter path
  // (scaling in the exp); a part of a block (100 keys) the general one.
  for (const int kCols : {100, int{kBlockKeys}})
    for (const bool masked : {true, false})
      for (const float scale : {0.61f, -0.61f})
        for (const Kernel& k : {Kernel{ops::attn::softmax_tile_avx512, "softmax_tile_avx512", 2e-6},
                                Kernel{ops::attn::softmax_tile_avx512_bf16p, "softmax_tile_avx512_bf16p", 1e-4}}) {
          const bool bf16_step = k.run == ops::attn::softmax_tile_avx512_bf16p;
          if (bf16_step && !bf16_step_runs) continue;
          const std::string name = std::string(k.name) + " cols " + std::to_string(kCols) + (masked ? " masked" : " unmasked") + " scale " +
                                   std::to_string(scale);
          std::vector<float> s = scores, m(m_start, m_start + kRows), l(l_start, l_start + kRows), alpha(kRows, -1.0f);
          ops::attn::SoftmaxTile t;
          t.s = s.data(), t.rows = kRows, t.cols = kCols, t.scale = scale, t.m = m.data(), t.l = l.data(), t.alpha = alpha.data();
          if (masked) t.mask = mask.data(), t.mask_ld = kBlockKeys, t.mask_rows = kRows;
          k.run(t);
          const auto attends = [&](int r, int j) { return !masked || mask[r * kBlockKeys + j] != 0; };
          for (int r = 0; r < kRows; ++r) {
            double row_max = m_start[r];
            for (int j = 0; j < kCols; ++j) {
              const double x = scores[r * kBlockKeys + j] * scale;
              if (attends(r, j) && !std::isnan(x)) row_max = std::max(row_max, x);
            }
            if (std::isinf(row_max)) EXPECT_EQ(m[r], row_max) << name << " row " << r;
            else EXPECT_NEAR(m[r], row_max, 1e-5 * std::fabs(row_max)) << name << " row " << r;
            double sum = 0;
            for (int j = 0; j < kCols; ++j) {
              const double x = scores[r * kBlockKeys + j] * scale;  // scaled in f32, as the kernels do
              const float got = s[r * kBlockKeys + j];
              if (std::isnan(x)) {
                EXPECT_TRUE(std::isnan(got)) << name << " row " << r << " col " << j;
                continue;
              }
              const double want = attends(r, j) ? std::exp(x - row_max) : 0.0;
              sum += want;
              if (std::isnan(want)) {  // an infinite score at an infinite max
                EXPECT_TRUE(std::isnan(got)) << name << " row " << r << " col " << j;
                continue;
              }
              // Beyond the exp itself: x - max in f32 is good to half an ulp of its operands' size.
              // Rows 4 and 5: P is 1 at their maxima (x - max = 0 exactly) and 0 elsewhere. Under an
              // infinite max (row 3 scaled by -0.61) the accurate exp stops at exp(-87.3), 1.2e-38
              // (that row's output is NaN whatever its P).
              double bound = want * (k.tolerance + 0x1p-23 * (std::fabs(x) + std::fabs(row_max))) + 1e-30;
              if (r == 4 || r == 5) bound = k.tolerance;
              if (want == 0.0) bound = std::isinf(row_max) ? 2e-38 : 1e-30;
              EXPECT_NEAR(got, want, bound) << name << " row " << r << " col " << j << " score " << x;
            }
            if (std::isnan(sum) || r == 2) {  // the sum holds a NaN
              EXPECT_TRUE(std::isnan(l[r])) << name << " row " << r;
              continue;
            }
            // alpha: exp_nonpositive stops at exp(-87.3), about 1e-38, rather than 0.
            const double want_alpha = std::isinf(m_start[r]) ? 0.0 : std::exp(m_start[r] - row_max);
            EXPECT_NEAR(alpha[r], want_alpha, 2e-6 * want_alpha + 1e-30) << name << " row " << r;
            const double want_l = l_start[r] * want_alpha + sum;
            // The sum: within the step's precision plus the scaling's rounding at this size (row 6).
            EXPECT_NEAR(l[r], want_l, want_l * (k.tolerance + 0x1p-22 * std::fabs(row_max))) << name << " row " << r;
          }
          if (!bf16_step) continue;
          // Again, writing bf16 P: the f32 P above rounded to nearest even, zero from the block's
          // end to the next 32 keys, the same running state. On a whole block, a row whose sum
          // comes out NaN (row 2's NaN score; row 3's -inf where scalef(NaN, -inf) is NaN, as Intel
          // documents it; AMD's Zen 4 gives 0) is done over by the general step, whose exp rounds
          // differently from the whole-block form: such a row matches the general step's P (the
          // kernel under an all-ones mask) instead.
          std::vector<float> s16 = scores, m16(m_start, m_start + kRows), l16(l_start, l_start + kRows), alpha16(kRows, -1.0f);
          std::vector<uint16_t> p16(kRows * kBlockKeys, 0xFFFF);
          ops::attn::SoftmaxTile t16 = t;
          t16.s = s16.data(), t16.m = m16.data(), t16.l = l16.data(), t16.alpha = alpha16.data(), t16.p_bf16 = p16.data();
          k.run(t16);
          std::vector<float> s_general = scores, m_general(m_start, m_start + kRows), l_general(l_start, l_start + kRows),
                             alpha_general(kRows);
          const std::vector<uint8_t> all_ones(kRows * kBlockKeys, 1);
          ops::attn::SoftmaxTile t_general = t;
          t_general.s = s_general.data(), t_general.m = m_general.data(), t_general.l = l_general.data();
          t_general.alpha = alpha_general.data(), t_general.mask = all_ones.data(), t_general.mask_ld = kBlockKeys;
          t_general.mask_rows = kRows;
          k.run(t_general);
          const bool whole_block = kCols == kBlockKeys && !masked && scale > 0;
          const auto same = [](float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); };
          for (int r = 0; r < kRows; ++r) {
            const bool redone = whole_block && (r == 2 || (r == 3 && !same(l16[r], l[r])));
            const float* p32 = (redone ? s_general : s).data() + r * kBlockKeys;
            const std::string row = name + " bf16 P row " + std::to_string(r);
            EXPECT_EQ(m16[r], m[r]) << row;
            EXPECT_EQ(alpha16[r], alpha[r]) << row;
            EXPECT_TRUE(same(l16[r], redone ? l_general[r] : l[r])) << row << ": " << l16[r];
            for (int j = 0; j < (kCols + 31) / 32 * 32; ++j) {
              const uint16_t got = p16[r * kBlockKeys + j];
              const std::string where = row + " col " + std::to_string(j);
              if (j >= kCols) EXPECT_EQ(got, 0) << where;
              else if (std::isnan(p32[j])) EXPECT_TRUE((got & 0x7F80) == 0x7F80 && (got & 0x7F) != 0) << where;
              else EXPECT_EQ(got, bf16_nearest_even(p32[j])) << where << " f32 " << p32[j];
            }
          }
        }
}

}  // namespace attention_softmax_tile_test
}  // namespace cubevec
