// Attention's log-sum-exp and the merge of partial results (what ring attention runs): the LSE of
// the flash and CV-pipelined kernels against a plain double loop written here, and attention over
// keys split into uneven chunks, merged chunk by chunk, against the dense double-loop reference.
//
// Tolerances (M = max |ref out|, as tests/common/attention_reference.h):
//   out f32: 1e-5 * sqrt(Sk + D) * max(1, M); bf16: one bf16 rounding per merge, 2^-7 * max(1, M) * chunks
//   lse: 1e-5 * max(1, |ref|) in f32 (a log of f32 sums); 2^-6 in bf16 (inputs rounded alike, so only the sums differ)
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>

#include "ops/attention.h"
#include "ops/vector_ops.h"

#include "common/attention_reference.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace attention_lse_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using ops::AttentionImpl;
using ops::AttentionLayout;

// Per (b, n, i): log sum_j exp(scale q_i . k_j) over the keys the mask keeps (-inf if none).
std::vector<double> reference_lse(const Qkv& x, int64_t b, int64_t sq, int64_t sk, int64_t n, int64_t d, const std::vector<uint8_t>* mask,
                                  double scale) {
  std::vector<double> out(static_cast<std::size_t>(b * n * sq));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ni = 0; ni < n; ++ni)
      for (int64_t i = 0; i < sq; ++i) {
        std::vector<double> s;
        for (int64_t j = 0; j < sk; ++j) {
          if (mask && !(*mask)[static_cast<std::size_t>((bi * sq + i) * sk + j)]) continue;
          double dot = 0;
          for (int64_t c = 0; c < d; ++c) dot += x.qd[((bi * sq + i) * n + ni) * d + c] * x.kd[((bi * sk + j) * n + ni) * d + c];
          s.push_back(dot * scale);
        }
        double mx = -INFINITY, sum = 0;
        for (double v : s) mx = std::max(mx, v);
        for (double v : s) sum += std::exp(v - mx);
        out[static_cast<std::size_t>((bi * n + ni) * sq + i)] = s.empty() ? -INFINITY : mx + std::log(sum);
      }
  return out;
}

void expect_lse(const std::vector<double>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      ASSERT_TRUE(std::isinf(got[i]) && got[i] < 0) << what << " at " << i << ": expected -inf, got " << got[i];
    } else {
      ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << what << " at " << i;
    }
  }
}

TEST(AttentionLse, FlashAndCvPipelinedReturnTheDoubleLoopsLogSumExp) {
  const int64_t b = 2, sq = 131, sk = 260, n = 2, d = 40;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Qkv x = make_qkv(b, sq, sk, n, d, dtype, 21);
    std::vector<uint8_t> mask = random_mask(b * sq * sk, 22, 0.6);
    for (int64_t j = 0; j < sk; ++j) mask[static_cast<std::size_t>((1 * sq + 7) * sk + j)] = 0;  // a row that sees nothing
    const double scale = 1.0 / std::sqrt(double(d));
    const auto want_out = reference_bsnd(x, b, sq, sk, n, d, &mask, b, 1, scale);
    const auto want_lse = reference_lse(x, b, sq, sk, n, d, &mask, scale);
    for (AttentionImpl impl : with_flash_bf16({AttentionImpl::flash, AttentionImpl::cv_pipelined}, dtype))
      for (AttentionLayout kl : {AttentionLayout::bnsd, AttentionLayout::bsnd}) {
        const std::string what = std::string(ops::attention_impl_name(impl)) + "/" + std::string(ops::attention_layout_name(kl)) + " " +
                                 std::string(dtype_name(dtype));
        ops::AttentionOptions o = manual(impl, kl);
        o.mask = bool_tensor(mask, {b, 1, sq, sk});
        const ops::AttentionPartial got = ops::attention_forward_with_lse(x.q, x.k, x.v, o);
        ASSERT_EQ(got.lse.shape(), (Shape{b, n, sq})) << what;
        ASSERT_EQ(got.lse.dtype(), DType::f32) << what;
        expect_matches(values(got.out), want_out, dtype, sk, d, what + " out");
        expect_lse(values(got.lse), want_lse, dtype == DType::bf16 ? std::ldexp(1.0, -6) : 1e-5, what + " lse");
      }
  }
}

// Keys [0, sk) in chunks, each attended alone and merged in ring order: the dense result.
TEST(AttentionLse, MergingChunksOfKeysGivesDenseAttention) {
  const int64_t b = 1, sq = 70, sk = 300, n = 3, d = 24;
  const std::vector<int64_t> chunks = {130, 1, 169};
  for (DType dtype : {DType::f32, DType::bf16})
    for (AttentionLayout layout : {AttentionLayout::bsnd, AttentionLayout::bnsd}) {
      const std::string what = std::string(dtype_name(dtype)) + " " + std::string(ops::attention_layout_name(layout));
      const Qkv x = make_qkv(b, sq, sk, n, d, dtype, 31);
      const double scale = 1.0 / std::sqrt(double(d));
      const auto want_out = reference_bsnd(x, b, sq, sk, n, d, nullptr, 1, 1, scale);
      const auto want_lse = reference_lse(x, b, sq, sk, n, d, nullptr, scale);
      const auto in_layout = [&](const Tensor& t) {
        return layout == AttentionLayout::bnsd ? ops::contiguous(t.permute({0, 2, 1, 3})) : t;
      };
      ops::AttentionOptions o;
      o.layout = layout;
      std::optional<ops::AttentionPartial> merged;
      int64_t k0 = 0;
      for (int64_t size : chunks) {
        const ops::AttentionPartial part =
            ops::attention_forward_with_lse(in_layout(x.q), in_layout(x.k.narrow(1, k0, size)), in_layout(x.v.narrow(1, k0, size)), o);
        merged = merged ? ops::merge_attention_partials(*merged, part, layout) : part;
        k0 += size;
      }
      const Tensor out = layout == AttentionLayout::bnsd ? ops::contiguous(merged->out.permute({0, 2, 1, 3})) : merged->out;
      if (dtype == DType::f32) {
        expect_matches(values(out), want_out, dtype, sk, d, what + " out");
      } else {
        double m = 1.0;
        for (double v : want_out) m = std::max(m, std::fabs(v));
        const auto got = values(out);
        for (std::size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want_out[i], std::ldexp(1.0, -7) * m * double(chunks.size())) << what << " at " << i;
      }
      expect_lse(values(merged->lse), want_lse, dtype == DType::bf16 ? std::ldexp(1.0, -6) : 1e-5, what + " lse");
    }
}

// A part whose row saw no key (out NaN, lse -inf) adds nothing; rows neither part saw stay NaN.
TEST(AttentionLse, APartThatSawNoKeyAddsNothing) {
  const int64_t sq = 4, sk = 8, n = 1, d = 8;
  const Qkv x = make_qkv(1, sq, sk, n, d, DType::f32, 41);
  std::vector<uint8_t> mask_a(static_cast<std::size_t>(sq * sk), 1), mask_b(static_cast<std::size_t>(sq * sk), 1);
  for (int64_t j = 0; j < sk; ++j) {
    mask_a[static_cast<std::size_t>(1 * sk + j)] = 0;  // row 1: only part b sees keys
    mask_a[static_cast<std::size_t>(3 * sk + j)] = 0;  // row 3: no part does
    mask_b[static_cast<std::size_t>(3 * sk + j)] = 0;
  }
  ops::AttentionOptions oa, ob;
  oa.mask = bool_tensor(mask_a, {sq, sk});
  ob.mask = bool_tensor(mask_b, {sq, sk});
  const ops::AttentionPartial a = ops::attention_forward_with_lse(x.q, x.k, x.v, oa);
  const ops::AttentionPartial b = ops::attention_forward_with_lse(x.q, x.k, x.v, ob);
  const ops::AttentionPartial m = ops::merge_attention_partials(a, b);
  const auto out = values(m.out), out_b = values(b.out), lse = values(m.lse), lse_b = values(b.lse);
  for (int64_t c = 0; c < d; ++c) {
    EXPECT_DOUBLE_EQ(out[static_cast<std::size_t>(1 * d + c)], out_b[static_cast<std::size_t>(1 * d + c)]) << c;
    EXPECT_TRUE(std::isnan(out[static_cast<std::size_t>(3 * d + c)])) << c;
    EXPECT_FALSE(std::isnan(out[static_cast<std::size_t>(0 * d + c)])) << c;
  }
  EXPECT_DOUBLE_EQ(lse[1], lse_b[1]);
  EXPECT_TRUE(std::isinf(lse[3]) && lse[3] < 0) << lse[3];
  // Rows both saw: the same keys twice, so the lse gains log 2 and the out is unchanged.
  EXPECT_NEAR(lse[0], lse_b[0] + std::log(2.0), 1e-5);
  for (int64_t c = 0; c < d; ++c) EXPECT_NEAR(out[static_cast<std::size_t>(c)], out_b[static_cast<std::size_t>(c)], 1e-6);
}

TEST(AttentionLse, BadArgumentsGiveClearErrors) {
  const Tensor q = random_tensor({1, 8, 2, 16}, 1), k = random_tensor({1, 6, 2, 16}, 2), v = random_tensor({1, 6, 2, 16}, 3);
  ops::AttentionOptions math = manual(AttentionImpl::math, AttentionLayout::bnsd);
  EXPECT_NE(message_of([&] {
              ops::attention_forward_with_lse(q, k, v, math);
            }).find("attention_forward_with_lse: op_type must be flash or cv_pipelined (the math path has no log-sum-exp)"),
            std::string::npos);
  ops::AttentionOptions bsh;
  bsh.layout = AttentionLayout::bsh;
  EXPECT_NE(message_of([&] { ops::attention_forward_with_lse(q, k, v, bsh); }).find("layout must be BSND or BNSD, got BSH"),
            std::string::npos);
  const ops::AttentionPartial a = ops::attention_forward_with_lse(q, k, v);
  const ops::AttentionPartial other =
      ops::attention_forward_with_lse(random_tensor({1, 8, 2, 8}, 4), random_tensor({1, 6, 2, 8}, 5), random_tensor({1, 6, 2, 8}, 6));
  EXPECT_NE(message_of([&] {
              ops::merge_attention_partials(a, other);
            }).find("merge_attention_partials: the two outs must have one shape and dtype, got f32 [1, 8, 2, 16] and f32 [1, 8, 2, 8]"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              ops::merge_attention_partials(a, a, AttentionLayout::bnsd);
            }).find("lse must be [B, N, Sq] = [1, 8, 2] for out f32 [1, 8, 2, 16] in layout BNSD, got f32 [1, 2, 8]"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              ops::merge_attention_partials(a, {a.out, Tensor{}});
            }).find("lse must be f32 [B, N, Sq], got nothing"),
            std::string::npos);
}

}  // namespace attention_lse_test
}  // namespace cubevec
