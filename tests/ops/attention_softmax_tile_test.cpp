// The online-softmax step of the AVX-512 flash tiles on its own, against exp in double: the
// accurate step (f32 flash) and the one for bf16 P (flash_bf16, flash_int8), with its whole-block
// path. The flash implementations around it are tested in attention_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/attention/tile_kernels.h"
#include "ops/isa.h"

namespace cubevec {
namespace attention_softmax_tile_test {  // named after the file: unity batches never mix two files' helpers

// One softmax step of the AVX-512 tile kernels against exp in double: P, the new running max and
// sum and the factor for O, on scores spread over a wide range (to below exp's f32 range), a masked
// key and a NaN score, continuing a running state. Relative to exp of the f32 argument: the accurate
// step 2e-6; the one for bf16 P (flash_bf16, flash_int8) 1e-4 (its polynomial's 7.5e-5; bf16
// itself rounds to 2^-9); both plus the f32 subtraction's rounding.
TEST(AttentionSoftmaxTile, StepMatchesExpInDoubleAtEachKernelsPrecision) {
  if (!ops::isa_supported(ops::Isa::avx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  using ops::attn::kBlockKeys;
  constexpr int kRows = 7;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> score(-40.0f, 12.0f);
  std::vector<float> scores(kRows * kBlockKeys, 0.0f);
  for (float& x : scores) x = score(rng);
  scores[1 * kBlockKeys + 5] = -1e4f;                                    // far below exp's range: P = 0
  scores[2 * kBlockKeys + 9] = std::numeric_limits<float>::quiet_NaN();  // a NaN score gives a NaN P
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
  const float m_start[kRows] = {-inf, 2.0f, 50.0f, -3.0f, -inf, -inf, 0.61f * 16777226.0f};
  const float l_start[kRows] = {0.0f, 3.5f, 1.25f, 7.0f, 0.0f, 0.0f, 2.0f};
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
            EXPECT_NEAR(m[r], row_max, 1e-5 * std::fabs(row_max)) << name << " row " << r;
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
              // Beyond the exp itself: x - max in f32 is good to half an ulp of its operands' size.
              // Rows 4 and 5: P is 1 at their maxima (x - max = 0 exactly) and 0 elsewhere.
              const double bound =
                  r == 4 || r == 5 ? k.tolerance : want * (k.tolerance + 0x1p-23 * (std::fabs(x) + std::fabs(row_max))) + 1e-30;
              EXPECT_NEAR(got, want, bound) << name << " row " << r << " col " << j << " score " << x;
            }
            if (r == 2) continue;  // its sum holds the NaN
            // alpha: exp_nonpositive stops at exp(-87.3), about 1e-38, rather than 0.
            const double want_alpha = std::isinf(m_start[r]) ? 0.0 : std::exp(m_start[r] - row_max);
            EXPECT_NEAR(alpha[r], want_alpha, 2e-6 * want_alpha + 1e-30) << name << " row " << r;
            const double want_l = l_start[r] * want_alpha + sum;
            // The sum: within the step's precision plus the scaling's rounding at this size (row 6).
            EXPECT_NEAR(l[r], want_l, want_l * (k.tolerance + 0x1p-22 * std::fabs(row_max))) << name << " row " << r;
          }
        }
}

}  // namespace attention_softmax_tile_test
}  // namespace cubevec
