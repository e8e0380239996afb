// A NaN or infinite input is not hidden: a NaN key (or bias) makes every score row that sees it NaN,
// in every implementation (math, flash, cv_pipelined, varlen, block-sparse), as in PyTorch's SDPA;
// the AVX-512 softmax once clamped it into a finite exponent and dropped it. The rows and heads
// that never see the NaN stay finite. relu(NaN) is NaN, as torch.relu.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "ops/attention.h"
#include "ops/vector_ops.h"
#include "tensor/tensor.h"

namespace cubevec {
namespace attention_nan_test {  // named after the file: unity batches never mix two files' helpers

using ops::AttentionImpl;
using ops::AttentionLayout;

constexpr int64_t kB = 1, kS = 40, kN = 2, kD = 16;
const float kNaN = std::numeric_limits<float>::quiet_NaN();

Tensor ramp(int64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(kB * kS * kN * kD));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(seed));
  return Tensor::from_vector(v, {kB, kS, kN, kD});
}

// Every element of head `head` NaN, every element of the other head finite.
void expect_only_head_nan(const Tensor& out, int64_t head, const char* what) {
  const Tensor c = out.contiguous();
  const float* p = c.data<float>();
  for (int64_t s = 0; s < kS; ++s)
    for (int64_t n = 0; n < kN; ++n)
      for (int64_t d = 0; d < kD; ++d) {
        const float x = p[((s * kN) + n) * kD + d];
        if (n == head) ASSERT_TRUE(std::isnan(x)) << what << " s " << s << " d " << d;
        else ASSERT_TRUE(std::isfinite(x)) << what << " s " << s << " d " << d;
      }
}

TEST(AttentionNan, ANanKeyReachesEveryRowOfItsHeadInEveryImplementation) {
  const Tensor q = ramp(1), v = ramp(3);
  Tensor k = ramp(2).clone();
  k.mutable_data<float>()[(7 * kN + 1) * kD + 5] = kNaN;  // key 7 of head 1
  for (AttentionImpl impl : {AttentionImpl::math, AttentionImpl::flash, AttentionImpl::cv_pipelined})
    for (AttentionLayout kernel_layout : {AttentionLayout::bnsd, AttentionLayout::bsnd}) {
      ops::AttentionOptions o;
      o.opt_mode = ops::AttentionOptMode::manual;
      o.op_type = impl;
      o.kernel_layout = kernel_layout;
      expect_only_head_nan(ops::attention_forward(q, k, v, o), 1, std::string(ops::attention_impl_name(impl)).c_str());
    }
  const Tensor cu = Tensor::from_vector(std::vector<int32_t>{0, kS}, {2});
  for (bool causal : {false, true}) {
    ops::VarlenOptions o;
    o.causal = causal;
    const Tensor out = ops::attention_forward_varlen(q.select(0, 0), k.select(0, 0), v.select(0, 0), cu, cu, o).contiguous();
    const float* p = out.data<float>();
    // Causal: rows before key 7 never see it.
    for (int64_t s = 0; s < kS; ++s)
      EXPECT_EQ(std::isnan(p[(s * kN + 1) * kD]), !causal || s >= 7) << "varlen causal " << causal << " row " << s;
  }
  const Tensor all_blocks = Tensor::from_vector(std::vector<uint8_t>{1}, {1, 1, 1, 1});
  ops::BlockSparseOptions bs;
  bs.layout = AttentionLayout::bsnd;
  expect_only_head_nan(ops::block_sparse_attention(q, k, v, all_blocks, bs), 1, "block sparse");
}

TEST(AttentionNan, ANanBiasAndAnInfiniteQueryAreNotDropped) {
  const Tensor q = ramp(1), k = ramp(2), v = ramp(3);
  std::vector<float> bias(static_cast<std::size_t>(kS * kS), 0.0f);
  bias[static_cast<std::size_t>(3 * kS + 4)] = kNaN;  // row 3, key 4
  ops::AttentionOptions o;
  o.mask = Tensor::from_vector(bias, {kS, kS});
  for (AttentionImpl impl : {AttentionImpl::math, AttentionImpl::flash, AttentionImpl::cv_pipelined}) {
    o.opt_mode = ops::AttentionOptMode::manual;
    o.op_type = impl;
    const Tensor out = ops::attention_forward(q, k, v, o).contiguous();
    const float* p = out.data<float>();
    for (int64_t s = 0; s < kS; ++s) EXPECT_EQ(std::isnan(p[s * kN * kD]), s == 3) << ops::attention_impl_name(impl) << " row " << s;
  }
  Tensor q_inf = q.clone();
  q_inf.mutable_data<float>()[(2 * kN + 0) * kD] = std::numeric_limits<float>::infinity();  // row 2 of head 0
  ops::AttentionOptions flash;
  flash.opt_mode = ops::AttentionOptMode::manual;
  const Tensor out = ops::attention_forward(q_inf, k, v, flash).contiguous();
  // inf * k gives +-inf scores (and NaN where k is 0 or the two infinities meet): never a finite answer.
  bool any_nonfinite = false;
  for (int64_t d = 0; d < kD; ++d) any_nonfinite |= !std::isfinite(out.data<float>()[(2 * kN + 0) * kD + d]);
  EXPECT_TRUE(any_nonfinite);
}

TEST(AttentionNan, ReluKeepsNaN) {
  const Tensor x = Tensor::from_vector(std::vector<float>{kNaN, -1.0f, 2.0f}, {3});
  const Tensor y = ops::activation(x, ops::Activation::relu).contiguous();
  EXPECT_TRUE(std::isnan(y.data<float>()[0]));
  EXPECT_EQ(y.data<float>()[1], 0.0f);
  EXPECT_EQ(y.data<float>()[2], 2.0f);
  EXPECT_TRUE(std::isnan(ops::activation_reference(ops::Activation::relu, std::nan(""))));
}

}  // namespace attention_nan_test
}  // namespace cubevec
