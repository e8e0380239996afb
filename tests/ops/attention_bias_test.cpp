// attention_forward with an f32 attn_mask, an additive bias (T5's relative position bias): every
// implementation against a plain double loop written here, with a 2-D bias, a 4-D bias broadcast
// over the batch, -inf entries (masked keys), finfo(f32).min entries (T5's padding mask) and a
// row whose every key carries the same huge negative bias (a uniform average, as in PyTorch).
//
// Tolerances as tests/common/attention_reference.h: f32 1e-5 * sqrt(Sk + D) * max(1, M); bf16
// 2^-7 * max(1, M) for flash and cv_pipelined, 0.04 for math (which rounds the scores and the
// probabilities to bf16, MindIE's semantics).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "ops/attention.h"

#include "common/attention_reference.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace attention_bias_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using ops::AttentionImpl;
using ops::AttentionLayout;

// softmax(scale q k^T + bias) v for BSND values, bias [Bb, N, Sq, Sk] with Bb 1 (broadcast) or b.
std::vector<double> reference_with_bias(const Qkv& x, int64_t b, int64_t sq, int64_t sk, int64_t n, int64_t d,
                                        const std::vector<float>& bias, int64_t bias_batch, int64_t bias_heads, double scale) {
  std::vector<double> out(static_cast<std::size_t>(b * sq * n * d), kNaN);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ni = 0; ni < n; ++ni) {
      const auto q = head_of(x.qd, bi, ni, sq, n, d), k = head_of(x.kd, bi, ni, sk, n, d), v = head_of(x.vd, bi, ni, sk, n, d);
      const float* bh = bias.data() + ((bias_batch == 1 ? 0 : bi) * bias_heads + (bias_heads == 1 ? 0 : ni)) * sq * sk;
      for (int64_t i = 0; i < sq; ++i) {
        std::vector<double> w(static_cast<std::size_t>(sk));
        double mx = -INFINITY;
        for (int64_t j = 0; j < sk; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += q[i * d + c] * k[j * d + c];
          w[j] = dot * scale + bh[i * sk + j];
          mx = std::max(mx, w[j]);
        }
        if (mx == -INFINITY) continue;
        double sum = 0;
        for (double& e : w) sum += e = std::exp(e - mx);
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < sk; ++j) acc += w[j] * v[j * d + c];
          out[((bi * sq + i) * n + ni) * d + c] = acc / sum;
        }
      }
    }
  return out;
}

std::vector<float> random_bias(int64_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> bias(static_cast<std::size_t>(count));
  for (float& e : bias) e = u(rng);
  return bias;
}

void expect_bias_result(const std::vector<double>& got, const std::vector<double>& want, DType dtype, AttentionImpl impl, int64_t sk,
                        int64_t d, const std::string& what) {
  if (impl == AttentionImpl::math && dtype == DType::bf16) {
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (std::isnan(want[i])) ASSERT_TRUE(std::isnan(got[i])) << what << " at " << i;
      else ASSERT_NEAR(got[i], want[i], 0.04) << what << " at " << i;
    }
  } else {
    expect_matches(got, want, dtype, sk, d, what);
  }
}

TEST(AttentionBias, FourDimensionalBiasBroadcastOverTheBatchMatchesTheDoubleLoop) {
  const int64_t b = 2, sq = 131, sk = 200, n = 3, d = 40;
  std::vector<float> bias = random_bias(n * sq * sk, 5);
  const float lowest = std::numeric_limits<float>::lowest();
  // Head 1: keys 150.. masked with -inf on every row; head 2: row 7 all lowest (uniform weights),
  // row 9 lowest past key 10 (T5's padding mask).
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 150; j < sk; ++j) bias[(1 * sq + i) * sk + j] = -INFINITY;
  for (int64_t j = 0; j < sk; ++j) bias[(2 * sq + 7) * sk + j] = lowest;
  for (int64_t j = 10; j < sk; ++j) bias[(2 * sq + 9) * sk + j] += lowest;
  Tensor bias_t = Tensor::from_vector(bias, {1, n, sq, sk});
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Qkv x = make_qkv(b, sq, sk, n, d, dtype, 11);
    const auto want = reference_with_bias(x, b, sq, sk, n, d, bias, 1, n, 0.25);
    for (AttentionImpl impl : with_flash_bf16({AttentionImpl::math, AttentionImpl::flash, AttentionImpl::cv_pipelined}, dtype))
      for (AttentionLayout kl : {AttentionLayout::bnsd, AttentionLayout::bsnd}) {
        ops::AttentionOptions o = manual(impl, kl);
        o.mask = bias_t;
        o.scale = 0.25;  // not the default D^-0.5 (T5 passes 1)
        const std::string what = std::string(ops::attention_impl_name(impl)) + "/" + std::string(ops::attention_layout_name(kl)) + " " +
                                 std::string(dtype_name(dtype));
        expect_bias_result(values(ops::attention_forward(x.q, x.k, x.v, o)), want, dtype, impl, sk, d, what);
      }
  }
}

TEST(AttentionBias, TwoDimensionalBiasAppliesToEveryHeadAndTheTunerKeysItApart) {
  const int64_t b = 1, sq = 64, sk = 77, n = 2, d = 32;
  const std::vector<float> bias = random_bias(sq * sk, 9);
  const Qkv x = make_qkv(b, sq, sk, n, d, DType::f32, 13);
  const auto want = reference_with_bias(x, b, sq, sk, n, d, bias, 1, 1, 1.0 / std::sqrt(32.0));
  ops::AttentionOptions o;  // runtime mode: the tuner times every candidate with the bias
  o.mask = Tensor::from_vector(bias, {sq, sk});
  expect_matches(values(ops::attention_forward(x.q, x.k, x.v, o)), want, DType::f32, sk, d, "runtime");
  // The same shapes without the bias must not reuse a wrong answer: a plain call differs.
  const auto plain = values(ops::attention_forward(x.q, x.k, x.v, ops::AttentionOptions{}));
  double diff = 0;
  for (std::size_t i = 0; i < plain.size(); ++i) diff = std::max(diff, std::fabs(plain[i] - want[i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(AttentionBias, WrongDtypeOrShapeIsAClearError) {
  const Qkv x = make_qkv(1, 8, 9, 1, 16, DType::f32, 3);
  ops::AttentionOptions o;
  o.mask = Tensor::zeros({8, 9}, DType::bf16);
  EXPECT_NE(message_of([&] { ops::attention_forward(x.q, x.k, x.v, o); }).find("attn_mask must be bool (true = attend) or f32"),
            std::string::npos);
  o.mask = Tensor::zeros({9, 8}, DType::f32);
  EXPECT_NE(message_of([&] { ops::attention_forward(x.q, x.k, x.v, o); }).find("a 2-D attn_mask must be [Sq, Sk] = [8, 9]"),
            std::string::npos);
}

}  // namespace attention_bias_test
}  // namespace cubevec
