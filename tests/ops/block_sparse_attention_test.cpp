// Block-sparse attention against the double loop with the same 128 x 128 blocks masked out
// (tests/common/attention_reference.h): the flash tiles of every ISA on hand-made heads (odd
// lengths, query panels spanning two query blocks, query blocks that keep nothing), every
// implementation and kernel layout through the public API in f32 and bf16 with broadcast mask
// dims, the all-kept mask giving today's flash bit for bit, the cost model, and the errors.
#include <gtest/gtest.h>

#include "device/device.h"
#include "ops/attention.h"
#include "ops/attention/flash_tiles.h"
#include "ops/attention/problem.h"

#include "common/attention_reference.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace block_sparse_attention_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using ops::AttentionImpl;
using ops::AttentionLayout;

constexpr int64_t kBlock = 128;

int64_t blocks(int64_t s) { return (s + kBlock - 1) / kBlock; }

// A random block mask [lq, lk]; query block `empty_row` (if >= 0) keeps nothing.
std::vector<uint8_t> random_block_mask(int64_t lq, int64_t lk, unsigned seed, double keep, int64_t empty_row = -1) {
  std::vector<uint8_t> m = random_mask(lq * lk, seed, keep);
  if (empty_row >= 0 && empty_row < lq)
    for (int64_t j = 0; j < lk; ++j) m[static_cast<std::size_t>(empty_row * lk + j)] = 0;
  return m;
}

// The element mask [sq, sk] of a block mask, and which rows belong to a query block keeping nothing.
std::vector<uint8_t> expand(const uint8_t* block_mask, int64_t sq, int64_t sk) {
  const int64_t lk = blocks(sk);
  std::vector<uint8_t> m(static_cast<std::size_t>(sq * sk));
  for (int64_t i = 0; i < sq; ++i)
    for (int64_t j = 0; j < sk; ++j) m[static_cast<std::size_t>(i * sk + j)] = block_mask[(i / kBlock) * lk + j / kBlock];
  return m;
}

// The reference of one head: masked attention, with zero rows where the query block keeps nothing.
std::vector<double> sparse_reference(const RefHead& head, const uint8_t* block_mask, double scale) {
  const std::vector<uint8_t> m = expand(block_mask, head.sq, head.sk);
  RefHead masked = head;
  masked.mask = m.data();
  std::vector<double> out = reference_head(masked, scale);
  const int64_t lk = blocks(head.sk);
  for (int64_t i = 0; i < head.sq; ++i) {
    const uint8_t* row = block_mask + (i / kBlock) * lk;
    if (std::all_of(row, row + lk, [](uint8_t b) { return b == 0; }))
      for (int64_t c = 0; c < head.d; ++c) out[static_cast<std::size_t>(i * head.d + c)] = 0.0;
  }
  return out;
}

TEST(BlockSparseFlash, EveryIsaMatchesTheMaskedDoubleLoop) {
  struct Case {
    int64_t sq, sk, d;
    double keep;
    int64_t empty_row;
  };
  // Lengths off the block edges; AVX-512 q-blocks of 56 rows straddle the 128-row query blocks.
  const Case cases[] = {{300, 300, 64, 0.5, -1}, {129, 257, 72, 0.4, 0},   {513, 200, 33, 0.3, 2},
                        {128, 128, 16, 0.0, -1}, {700, 650, 128, 0.25, 3}, {1, 129, 8, 1.0, -1}};
  for (ops::Isa isa : {ops::Isa::avx512, ops::Isa::avx2, ops::Isa::portable}) {
    if (!ops::isa_supported(isa)) continue;
    const ops::attn::TileKernels& kernels = ops::attn::tile_kernels(isa);
    for (DType dtype : {DType::f32, DType::bf16}) {
      unsigned seed = 300;
      for (const Case& c : cases) {
        const std::string what = std::string(ops::isa_name(isa)) + " " + std::string(dtype_name(dtype)) + " sq=" + std::to_string(c.sq) +
                                 " sk=" + std::to_string(c.sk) + " d=" + std::to_string(c.d) + " keep=" + std::to_string(c.keep);
        const Qkv x = make_qkv(1, c.sq, c.sk, 1, c.d, dtype, seed += 10);
        const std::vector<uint8_t> keep = random_block_mask(blocks(c.sq), blocks(c.sk), seed, c.keep, c.empty_row);
        Tensor out = Tensor::empty({c.sq, c.d}, dtype);
        ops::attn::AttentionBatch batch;
        batch.d = c.d;
        batch.dtype = dtype;
        batch.scale = 0.29f;
        ops::attn::HeadProblem h;
        h.q = x.q.data_ptr();
        h.k = x.k.data_ptr();
        h.v = x.v.data_ptr();
        h.out = out.mutable_data_ptr();
        h.q_ld = h.k_ld = h.v_ld = h.out_ld = c.d;
        h.sq = c.sq;
        h.sk = c.sk;
        h.block_keep = keep.data();
        h.block_ld = blocks(c.sk);
        batch.heads.push_back(h);
        ops::attn::run_flash(batch, &kernels);
        const auto want = sparse_reference({c.sq, c.sk, c.d, x.qd.data(), x.kd.data(), x.vd.data(), nullptr, false}, keep.data(), 0.29);
        expect_matches(values(out), want, dtype, c.sk, c.d, what);
      }
    }
  }
}

ops::BlockSparseOptions manual(AttentionImpl impl, AttentionLayout kernel_layout) {
  ops::BlockSparseOptions o;
  o.opt_mode = ops::AttentionOptMode::manual;
  o.op_type = impl;
  o.kernel_layout = kernel_layout;
  return o;
}

TEST(BlockSparseAttention, EveryImplementationAndLayoutWithBroadcastMasks) {
  const int64_t b = 2, s = 390, n = 3, d = 40, l = blocks(s);
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Qkv x = make_qkv(b, s, s, n, d, dtype, 21);
    // Per (batch, head) masks, and one shared by every batch ([1, N, L, L]); batch 1 head 2 has an empty query block.
    for (const int64_t mask_batches : {b, int64_t{1}}) {
      std::vector<uint8_t> keep;
      for (int64_t i = 0; i < mask_batches * n; ++i) {
        const std::vector<uint8_t> one = random_block_mask(l, l, 40 + static_cast<unsigned>(i), 0.5, i == mask_batches * n - 1 ? 1 : -1);
        keep.insert(keep.end(), one.begin(), one.end());
      }
      const Tensor mask = bool_tensor(keep, {mask_batches, n, l, l});
      std::vector<double> want(static_cast<std::size_t>(b * s * n * d));
      for (int64_t bi = 0; bi < b; ++bi)
        for (int64_t ni = 0; ni < n; ++ni) {
          const auto q = head_of(x.qd, bi, ni, s, n, d), k = head_of(x.kd, bi, ni, s, n, d), v = head_of(x.vd, bi, ni, s, n, d);
          const uint8_t* m = keep.data() + ((mask_batches == 1 ? 0 : bi) * n + ni) * l * l;
          const auto o = sparse_reference({s, s, d, q.data(), k.data(), v.data(), nullptr, false}, m, 1.0 / std::sqrt(double(d)));
          for (int64_t i = 0; i < s; ++i)
            for (int64_t c = 0; c < d; ++c)
              want[static_cast<std::size_t>(((bi * s + i) * n + ni) * d + c)] = o[static_cast<std::size_t>(i * d + c)];
        }
      for (AttentionImpl impl : with_flash_bf16({AttentionImpl::flash, AttentionImpl::cv_pipelined}, dtype))
        for (AttentionLayout kl : {AttentionLayout::bnsd, AttentionLayout::bsnd}) {
          const std::string what = std::string(ops::attention_impl_name(impl)) + "/" + std::string(ops::attention_layout_name(kl)) + " " +
                                   std::string(dtype_name(dtype)) + " mask batches " + std::to_string(mask_batches);
          expect_matches(values(ops::block_sparse_attention(x.q, x.k, x.v, mask, manual(impl, kl))), want, dtype, s, d, what);
        }
      // BNSD input gives the same values in its own layout.
      ops::BlockSparseOptions bnsd;
      bnsd.layout = AttentionLayout::bnsd;
      const Tensor out = ops::block_sparse_attention(x.q.permute({0, 2, 1, 3}).contiguous(), x.k.permute({0, 2, 1, 3}).contiguous(),
                                                     x.v.permute({0, 2, 1, 3}).contiguous(), mask, bnsd);
      expect_matches(values(out.permute({0, 2, 1, 3}).contiguous()), want, dtype, s, d, "BNSD input, tuned");
    }
  }
}

TEST(BlockSparseAttention, AllKeptIsTodaysFlashBitForBit) {
  const int64_t s = 333, n = 2, d = 64, l = blocks(s);
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Qkv x = make_qkv(1, s, s, n, d, dtype, 5);
    const Tensor all = bool_tensor(std::vector<uint8_t>(static_cast<std::size_t>(n * l * l), 1), {1, n, l, l});
    for (AttentionImpl impl : with_flash_bf16({AttentionImpl::flash, AttentionImpl::cv_pipelined}, dtype)) {
      ops::AttentionOptions dense;
      dense.opt_mode = ops::AttentionOptMode::manual;
      dense.op_type = impl;
      const std::vector<double> want = values(ops::attention_forward(x.q, x.k, x.v, dense));
      const std::vector<double> got = values(ops::block_sparse_attention(x.q, x.k, x.v, all, manual(impl, AttentionLayout::bnsd)));
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << ops::attention_impl_name(impl) << " at " << i;
    }
  }
}

TEST(BlockSparseAttention, CostModelCountsTheKeptBlocks) {
  Device device(builtin_cpu_profile(), {.simulate = true, .trace = true});
  const int64_t s = 1024, n = 2, d = 64, l = blocks(s);
  const Tensor q = Tensor::meta({1, s, n, d}, DType::f32), mask = Tensor::meta({1, n, l, l}, DType::boolean);
  ops::BlockSparseOptions o;
  o.density = 0.25;
  ops::block_sparse_attention(q, q, q, mask, o, device.default_stream());
  device.synchronize();
  const auto records = device.trace().records();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].desc.name, "block_sparse_attention_flash");
  EXPECT_DOUBLE_EQ(records[0].desc.flops, 0.25 * 4.0 * double(n) * double(s) * double(s) * double(d));
}

TEST(BlockSparseAttention, BadArgumentsNameTheProblem) {
  const Tensor q = random_tensor({1, 200, 2, 16}, 1);
  const auto error = [&](const Tensor& mask, ops::BlockSparseOptions o = {}) {
    return message_of([&] { ops::block_sparse_attention(q, q, q, mask, o); });
  };
  EXPECT_NE(
      error(Tensor::zeros({1, 2, 2, 3}, DType::boolean))
          .find("block_sparse_attention: block_mask must be bool or u8 [B, N, ceil(Sq/128), ceil(Sk/128)] = [1, 2, 2, 2] (B and N may "
                "be 1), got bool [1, 2, 2, 3]"),
      std::string::npos);
  EXPECT_NE(error(Tensor::zeros({1, 2, 2, 2}, DType::f32)).find("got f32 [1, 2, 2, 2]"), std::string::npos);
  EXPECT_NE(error(Tensor()).find("got nothing"), std::string::npos);
  const Tensor ok = Tensor::zeros({1, 1, 2, 2}, DType::u8);
  EXPECT_NE(error(ok, manual(AttentionImpl::math, AttentionLayout::bnsd)).find("op_type must be flash or cv_pipelined"), std::string::npos);
  ops::BlockSparseOptions density;
  density.density = 1.5;
  EXPECT_NE(error(ok, density).find("density must be in [0, 1], got 1.5"), std::string::npos);
  ops::BlockSparseOptions bsh;
  bsh.layout = AttentionLayout::bsh;
  EXPECT_NE(error(ok, bsh).find("layout must be BSND or BNSD"), std::string::npos);
  const Tensor kv3 = random_tensor({1, 200, 3, 16}, 2);
  EXPECT_NE(message_of([&] { ops::block_sparse_attention(q, kv3, kv3, ok); }).find("block_sparse_attention: key must match query"),
            std::string::npos);
}

}  // namespace block_sparse_attention_test
}  // namespace cubevec
