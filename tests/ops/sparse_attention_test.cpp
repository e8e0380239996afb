// MindIE SD's sparse_attention against references written here from its description
// (docs/ops.md, "MindIE SD's sparse_attention", and the rf_v2 / ada_bsa sources): rf_v2's reorder as an
// exact permutation given by a closed formula (aligned and remainder shapes, MindIE's test shapes),
// its pooled block mask against a double-precision reference, ada_bsa's block scores against the
// formula and its row selection against "the smallest set reaching the CDF threshold", both
// algorithms at sparsity 0 equal to dense attention, at sparsity > 0 equal to the double loop with
// their own mask, and the argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>

#include "ops/attention/sparse_ada_bsa.h"
#include "ops/attention/sparse_rf_v2.h"
#include "ops/sparse_attention.h"

#include "common/attention_reference.h"
#include "common/tensor_testing.h"

namespace cubevec {
namespace sparse_attention_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using ops::AttentionLayout;
using ops::SparseType;

constexpr int64_t kBlock = 128;
int64_t blocks(int64_t s) { return (s + kBlock - 1) / kBlock; }

// Where raster token (f, y, x) goes in rf_v2's order, from the einops patterns of MindIE's code.
int64_t rf_v2_position(int64_t t, int64_t h, int64_t w, int64_t f, int64_t y, int64_t x) {
  (void)t;
  const auto tile = [](int64_t row, int64_t col, int64_t w8) { return ((row / 8) * (w8 / 8) + col / 8) * 64 + (row % 8) * 8 + col % 8; };
  if (h % 8 == 0 && w % 8 == 0) return f * h * w + tile(y, x, w);
  if (f == 0) return y * w + x;
  const int64_t h8 = h - h % 8, w8 = w - w % 8;
  int64_t in_frame;
  if (y < h8 && x < w8) in_frame = tile(y, x, w8);
  else if (y >= h8) in_frame = h8 * w8 + (y - h8) * w + x;
  else in_frame = h8 * w8 + (h % 8) * w + y * (w % 8) + (x - w8);
  return f * h * w + in_frame;
}

TEST(SparseRfV2, ReorderIsTheExactPermutationOfTheFormula) {
  // MindIE's test shapes (aligned, and with h or w remainders) and small odd ones.
  const ops::LatentShape shapes[] = {{3, 40, 80}, {3, 30, 52}, {2, 21, 32}, {2, 24, 45}, {1, 16, 8}, {4, 9, 9}, {2, 8, 3}};
  for (const auto& shape : shapes) {
    const auto [t, h, w] = shape;
    const std::vector<int32_t> order = ops::attn::rf_v2::image_token_order(shape);
    ASSERT_EQ(order.size(), static_cast<std::size_t>(t * h * w));
    std::vector<int32_t> seen(order.size(), 0);
    for (int64_t f = 0; f < t; ++f)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x) {
          const int64_t pos = rf_v2_position(t, h, w, f, y, x);
          ASSERT_EQ(order[static_cast<std::size_t>(pos)], f * h * w + y * w + x) << t << "x" << h << "x" << w << " at " << pos;
          ++seen[static_cast<std::size_t>(pos)];
        }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int32_t c) { return c == 1; }));
  }
  // With text: [reordered image; text] from [text; image].
  const std::vector<int32_t> seq = ops::attn::rf_v2::sequence_order({2, 8, 8}, 5);
  ASSERT_EQ(seq.size(), 133u);
  EXPECT_EQ(seq[0], 5);
  EXPECT_EQ(seq[8], 5 + 8);  // second row of the first tile
  for (int i = 0; i < 5; ++i) EXPECT_EQ(seq[static_cast<std::size_t>(128 + i)], i);
}

// rf_v2's mask for one head in double, from the description.
std::vector<uint8_t> rf_v2_reference_mask(const std::vector<double>& q, const std::vector<double>& k, int64_t image, int64_t text,
                                          int64_t d, int64_t first_frame, double scale, double sparsity) {
  const auto pool = [&](const std::vector<double>& x) {
    std::vector<std::vector<double>> out;
    const auto add = [&](int64_t r0, int64_t r1) {
      std::vector<double> m(static_cast<std::size_t>(d), 0.0);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = 0; c < d; ++c) m[static_cast<std::size_t>(c)] += x[static_cast<std::size_t>(r * d + c)] / double(r1 - r0);
      out.push_back(m);
    };
    for (int64_t r = 0; r < image; r += kBlock) add(r, std::min(image, r + kBlock));
    for (int64_t r = 0; r < text; r += kBlock) add(image + r, image + std::min(text, r + kBlock));
    return out;
  };
  const auto qp = pool(q), kp = pool(k);
  const auto l = static_cast<int64_t>(qp.size());
  const auto keep = static_cast<int64_t>(std::ceil(double(l) * (1.0 - sparsity)));
  std::vector<uint8_t> mask(static_cast<std::size_t>(l * l));
  for (int64_t i = 0; i < l; ++i) {
    std::vector<double> a(static_cast<std::size_t>(l));
    double mx = -INFINITY;
    for (int64_t j = 0; j < l; ++j) {
      a[static_cast<std::size_t>(j)] = std::inner_product(qp[static_cast<std::size_t>(i)].begin(), qp[static_cast<std::size_t>(i)].end(),
                                                          kp[static_cast<std::size_t>(j)].begin(), 0.0) *
                                       scale;
      mx = std::max(mx, a[static_cast<std::size_t>(j)]);
    }
    for (double& x : a) x = std::exp(x - mx);  // the order is all the mask needs: no normalization
    std::vector<double> sorted = a;
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    for (int64_t j = 0; j < l; ++j)
      mask[static_cast<std::size_t>(i * l + j)] = a[static_cast<std::size_t>(j)] >= sorted[static_cast<std::size_t>(keep - 1)];
  }
  const int64_t tb = (text + kBlock - 1) / kBlock, ff = (first_frame + kBlock - 1) / kBlock;
  for (int64_t i = 0; i < l; ++i)
    for (int64_t j = 0; j < l; ++j)
      if (i >= l - tb || j >= l - tb || i < ff || j < ff) mask[static_cast<std::size_t>(i * l + j)] = 1;
  return mask;
}

// The double loop over the original token order with the kernel's block mask mapped back through
// the reorder (token i sits at kernel position inverse[i]).
std::vector<double> reference_with_kernel_mask(const Qkv& x, int64_t b, int64_t s, int64_t n, int64_t d, const Tensor& kernel_mask,
                                               const std::vector<int32_t>& order, double scale) {
  std::vector<int32_t> inverse(order.size());
  for (std::size_t i = 0; i < order.size(); ++i) inverse[static_cast<std::size_t>(order[i])] = static_cast<int32_t>(i);
  const Tensor km = kernel_mask.contiguous();
  const auto* kb = static_cast<const uint8_t*>(km.data_ptr());
  const int64_t lk = blocks(s), mb = km.size(0);
  std::vector<double> out(static_cast<std::size_t>(b * s * n * d));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t ni = 0; ni < n; ++ni) {
      const uint8_t* head = kb + ((mb == 1 ? 0 : bi) * n + ni) * lk * lk;
      std::vector<uint8_t> m(static_cast<std::size_t>(s * s));
      for (int64_t i = 0; i < s; ++i)
        for (int64_t j = 0; j < s; ++j)
          m[static_cast<std::size_t>(i * s + j)] =
              head[(inverse[static_cast<std::size_t>(i)] / kBlock) * lk + inverse[static_cast<std::size_t>(j)] / kBlock];
      const auto q = head_of(x.qd, bi, ni, s, n, d), k = head_of(x.kd, bi, ni, s, n, d), v = head_of(x.vd, bi, ni, s, n, d);
      const auto o = reference_head({s, s, d, q.data(), k.data(), v.data(), m.data(), false}, scale);
      for (int64_t i = 0; i < s; ++i)
        for (int64_t c = 0; c < d; ++c)
          out[static_cast<std::size_t>(((bi * s + i) * n + ni) * d + c)] = o[static_cast<std::size_t>(i * d + c)];
    }
  return out;
}

ops::SparseAttentionOptions rf_v2(ops::LatentShape latent, int64_t txt_len, double sparsity) {
  ops::SparseAttentionOptions o;
  o.sparse_type = SparseType::rf_v2;
  o.latent_shape_q = latent;
  o.txt_len = txt_len;
  o.sparsity = sparsity;
  o.input_layout = AttentionLayout::bsnd;
  return o;
}

TEST(SparseRfV2, MaskAndOutputAgainstTheReferences) {
  struct Case {
    ops::LatentShape latent;
    int64_t txt;
    double sparsity;
  };
  // 16 x 16 frames (2 blocks each), remainders, text, MindIE's ceil(L * (1 - s)) with L = 10.
  const Case cases[] = {{{4, 16, 16}, 0, 0.5}, {{3, 12, 20}, 40, 0.6}, {{5, 16, 16}, 128, 0.7}, {{2, 24, 45}, 0, 0.3}};
  for (const Case& c : cases) {
    const int64_t image = c.latent[0] * c.latent[1] * c.latent[2], s = image + c.txt, b = 2, n = 2, d = 16;
    SCOPED_TRACE("latent " + std::to_string(c.latent[0]) + "x" + std::to_string(c.latent[1]) + "x" + std::to_string(c.latent[2]) +
                 " text " + std::to_string(c.txt) + " sparsity " + std::to_string(c.sparsity));
    const Qkv x = make_qkv(b, s, s, n, d, DType::f32, 11);
    const ops::SparseAttentionResult r = ops::sparse_attention(x.q, x.k, x.v, rf_v2(c.latent, c.txt, c.sparsity));
    const int64_t l = ops::attn::rf_v2::pooled_blocks(image, c.txt);
    // Every batch's own mask (MindIE's get_blockwise_mask); the kernel walks batch 0's.
    ASSERT_EQ(r.kept_blocks.shape(), (Shape{b, n, l, l}));
    const std::vector<int32_t> order = ops::attn::rf_v2::sequence_order(c.latent, c.txt);
    const Tensor kept = r.kept_blocks.contiguous();
    int64_t kept_count = 0;
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t ni = 0; ni < n; ++ni) {
        // The head in the kernel's order, as the reference sees it.
        std::vector<double> q, k;
        for (int32_t src : order)
          for (int64_t cc = 0; cc < d; ++cc) {
            q.push_back(x.qd[static_cast<std::size_t>(((bi * s + src) * n + ni) * d + cc)]);
            k.push_back(x.kd[static_cast<std::size_t>(((bi * s + src) * n + ni) * d + cc)]);
          }
        const std::vector<uint8_t> want =
            rf_v2_reference_mask(q, k, image, c.txt, d, c.latent[1] * c.latent[2], 1.0 / std::sqrt(double(d)), c.sparsity);
        const auto* got = static_cast<const uint8_t*>(kept.data_ptr()) + (bi * n + ni) * l * l;
        for (int64_t i = 0; i < l * l; ++i)
          ASSERT_EQ(got[i], want[static_cast<std::size_t>(i)]) << "batch " << bi << " head " << ni << " block " << i;
        kept_count += std::count(got, got + l * l, uint8_t{1});
      }
    EXPECT_LT(kept_count, b * n * l * l) << "the case must prune something";
    const Tensor kernel_mask = r.kept_blocks.narrow(0, 0, 1).narrow(2, 0, blocks(s)).narrow(3, 0, blocks(s));
    expect_matches(values(r.out), reference_with_kernel_mask(x, b, s, n, d, kernel_mask, order, 1.0 / std::sqrt(double(d))), DType::f32, s,
                   d, "rf_v2 output");
  }
}

TEST(SparseAttention, SparsityZeroIsDenseAttention) {
  const int64_t b = 1, n = 2, d = 32;
  for (const AttentionLayout layout : {AttentionLayout::bsnd, AttentionLayout::bnsd})
    for (DType dtype : {DType::f32, DType::bf16}) {
      const ops::LatentShape latent{3, 16, 24};
      const int64_t txt = 20, s = 3 * 16 * 24 + txt;
      const Qkv x = make_qkv(b, s, s, n, d, dtype, 3);
      const auto in_layout = [&](const Tensor& t) { return layout == AttentionLayout::bnsd ? t.permute({0, 2, 1, 3}).contiguous() : t; };
      const auto from_layout = [&](const Tensor& t) { return layout == AttentionLayout::bnsd ? t.permute({0, 2, 1, 3}).contiguous() : t; };
      const std::vector<double> want = reference_bsnd(x, b, s, s, n, d, nullptr, 1, 1, 1.0 / std::sqrt(double(d)));
      for (const SparseType type : {SparseType::none, SparseType::rf_v2, SparseType::ada_bsa}) {
        ops::SparseAttentionOptions o = rf_v2(latent, txt, 0.0);
        o.sparse_type = type;
        o.input_layout = layout;
        const ops::SparseAttentionResult r = ops::sparse_attention(in_layout(x.q), in_layout(x.k), in_layout(x.v), o);
        expect_matches(values(from_layout(r.out)), want, dtype, s, d,
                       std::string(ops::sparse_type_name(type)) + " " + std::string(ops::attention_layout_name(layout)) + " " +
                           std::string(dtype_name(dtype)));
        if (type != SparseType::none) {
          const Tensor kept = r.kept_blocks.contiguous();
          const auto* p = static_cast<const uint8_t*>(kept.data_ptr());
          EXPECT_TRUE(std::all_of(p, p + kept.numel(), [](uint8_t v) { return v == 1; })) << "sparsity 0 keeps every block";
        }
      }
    }
}

// ada_bsa's block scores from the formula, in double.
std::vector<double> ada_reference_scores(const std::vector<double>& q, const std::vector<double>& k, int64_t s, int64_t d, double scale) {
  const int64_t gq = (s + 7) / 8, gk = s / 8, l = blocks(s);
  std::vector<double> scores(static_cast<std::size_t>(l * l), 0.0);
  for (int64_t g = 0; g < gq; ++g) {
    std::vector<double> p(static_cast<std::size_t>(gk));
    double mx = -INFINITY, sum = 0;
    for (int64_t h = 0; h < gk; ++h) {
      double dot = 0;
      for (int64_t j = 0; j < 8; ++j) {
        const int64_t qi = 8 * g + 7 - j, ki = 8 * h + j;
        if (qi >= s) continue;
        for (int64_t c = 0; c < d; ++c) dot += q[static_cast<std::size_t>(qi * d + c)] * k[static_cast<std::size_t>(ki * d + c)];
      }
      p[static_cast<std::size_t>(h)] = dot * scale / 8.0;
      mx = std::max(mx, p[static_cast<std::size_t>(h)]);
    }
    for (double& x : p) sum += x = std::exp(x - mx);
    for (int64_t h = 0; h < gk; ++h) scores[static_cast<std::size_t>((g / 16) * l + h / 16)] += p[static_cast<std::size_t>(h)] / sum;
  }
  return scores;
}

TEST(SparseAdaBsa, BlockScoresFollowTheAntidiagonalFormula) {
  for (const int64_t s : {int64_t{300}, int64_t{517}, int64_t{1030}}) {
    const int64_t d = 24;
    const std::vector<float> q = random_values(s * d, 5, -1, 1), k = random_values(s * d, 6, -1, 1);
    const int64_t l = blocks(s);
    std::vector<float> got(static_cast<std::size_t>(l * l));
    ops::attn::ada_bsa::block_scores(q.data(), d, s, k.data(), d, s, d, 0.4f, got.data());
    const auto want = ada_reference_scores(std::vector<double>(q.begin(), q.end()), std::vector<double>(k.begin(), k.end()), s, d, 0.4);
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5 * 16) << "s=" << s << " block " << i;
  }
}

// "The smallest set of blocks whose estimated mass reaches the threshold", the forced blocks, the cap.
std::vector<uint8_t> ada_reference_row(const std::vector<float>& scores, const ops::attn::ada_bsa::Params& p) {
  const auto l = static_cast<int64_t>(scores.size());
  std::set<int64_t> forced{l - 1};
  if (p.keep_sink) forced.insert(0);
  std::vector<std::pair<double, int64_t>> ranked;
  double total = 0;
  for (int64_t j = 0; j < l; ++j)
    if (!forced.count(j)) ranked.push_back({scores[static_cast<std::size_t>(j)], j}), total += scores[static_cast<std::size_t>(j)];
  std::sort(ranked.begin(), ranked.end(), std::greater<>());
  std::size_t take = ranked.size();
  double compared = static_cast<double>(l);  // what the kernel compares with the cap
  if (p.threshold < 1.0f) {
    double mass = 0;
    for (take = 0; take < ranked.size() && mass < p.threshold * total;) mass += ranked[take++].first;
    compared = static_cast<double>(take) - 1;  // the kernel's count is then an index: a set one over the cap passes
  }
  // The cap is a float32 product, as the kernel's (row_sparse is a float attribute).
  const float cap = static_cast<float>(l) * p.row_sparse;
  if (l >= 10 && compared > static_cast<double>(cap)) take = std::min(ranked.size(), static_cast<std::size_t>(cap));
  std::vector<uint8_t> keep(static_cast<std::size_t>(l), 0);
  for (std::size_t i = 0; i < take; ++i) keep[static_cast<std::size_t>(ranked[i].second)] = 1;
  for (int64_t j : forced) keep[static_cast<std::size_t>(j)] = 1;
  keep[0] = 1;
  return keep;
}

TEST(SparseAdaBsa, RowSelectionKeepsTheSmallestSetReachingTheThreshold) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  int cut = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t l = 3 + trial % 40;
    std::vector<float> scores(static_cast<std::size_t>(l));
    for (float& x : scores) x = u(rng) * u(rng);  // skewed, distinct
    ops::attn::ada_bsa::Params p;
    p.threshold = trial % 3 == 0 ? 1.0f : 0.3f + 0.6f * u(rng);
    p.keep_sink = trial % 2 == 0;
    p.row_sparse = trial % 5 == 0 ? 1.0f : 0.2f + 0.7f * u(rng);
    std::vector<uint8_t> got(static_cast<std::size_t>(l));
    ops::attn::ada_bsa::select_row(scores.data(), l, p, got.data());
    const std::vector<uint8_t> want = ada_reference_row(scores, p);
    ASSERT_EQ(got, want) << "trial " << trial << " L=" << l << " threshold " << p.threshold << " row_sparse " << p.row_sparse;
    cut += std::count(got.begin(), got.end(), uint8_t{0}) > 0;
  }
  EXPECT_GT(cut, 200) << "most rows must drop blocks";
}

// MindIE's row_sparse = 1.0 - sparsity reaches the kernel as a float attribute, and the cap is a
// float32 product: at L = 10 and sparsity 0.8 it is 2.0f, not the double 1.9999999999999996.
TEST(SparseAdaBsa, CapIsTheFloat32Product) {
  const auto row_sparse = [](double sparsity) { return ops::attn::ada_bsa::make_params(1.0f, 1.0, true, true, sparsity).row_sparse; };
  EXPECT_EQ(ops::attn::ada_bsa::capped_count(10, row_sparse(0.8)), 2);
  EXPECT_EQ(ops::attn::ada_bsa::capped_count(10, row_sparse(0.9)), 1);
  EXPECT_EQ(ops::attn::ada_bsa::capped_count(15, row_sparse(0.8)), 3);
  EXPECT_EQ(ops::attn::ada_bsa::capped_count(10, row_sparse(0.5)), 5);
  // Sorted ranked mass 0.3, 0.25, 0.2, ...: a 0.7 cut stops at index 2, which 2.0f does not cap.
  const std::vector<float> scores{0.05f, 0.3f, 0.25f, 0.2f, 0.1f, 0.04f, 0.03f, 0.02f, 0.01f, 0.5f};
  std::vector<uint8_t> got(scores.size());
  ops::attn::ada_bsa::select_row(scores.data(), 10, ops::attn::ada_bsa::make_params(1.0f, 0.7, false, true, 0.8), got.data());
  EXPECT_EQ(got, (std::vector<uint8_t>{1, 1, 1, 1, 0, 0, 0, 0, 0, 1}));
  // Without a cut the cap keeps the 2 best ranked blocks (block 0 and the last are kept anyway).
  ops::attn::ada_bsa::select_row(scores.data(), 10, ops::attn::ada_bsa::make_params(1.0f, 1.0, false, true, 0.8), got.data());
  EXPECT_EQ(got, (std::vector<uint8_t>{1, 1, 1, 0, 0, 0, 0, 0, 0, 1}));
}

TEST(SparseAdaBsa, OutputIsTheDoubleLoopWithItsMask) {
  const int64_t b = 2, n = 2, d = 16, s = 1400;  // 11 blocks: the cap applies (L >= 10)
  const Qkv x = make_qkv(b, s, s, n, d, DType::f32, 17);
  ops::SparseAttentionOptions o;
  o.sparse_type = SparseType::ada_bsa;
  o.sparsity = 0.6;
  o.cdf_threshold = 0.9;
  o.input_layout = AttentionLayout::bsnd;
  const ops::SparseAttentionResult r = ops::sparse_attention(x.q, x.k, x.v, o);
  ASSERT_EQ(r.kept_blocks.shape(), (Shape{b, n, 11, 11}));
  std::vector<int32_t> identity(static_cast<std::size_t>(s));
  std::iota(identity.begin(), identity.end(), 0);
  expect_matches(values(r.out), reference_with_kernel_mask(x, b, s, n, d, r.kept_blocks, identity, 1.0 / std::sqrt(double(d))), DType::f32,
                 s, d, "ada_bsa output");
  // Rows keep at most int(11 * 0.4) = 4 ranked blocks plus the forced ones.
  const Tensor kept = r.kept_blocks.contiguous();
  const auto* p = static_cast<const uint8_t*>(kept.data_ptr());
  for (int64_t row = 0; row < b * n * 11; ++row) {
    const int64_t count = std::count(p + row * 11, p + row * 11 + 11, uint8_t{1});
    EXPECT_LE(count, 6) << row;
    EXPECT_GE(count, 2) << row;
    EXPECT_EQ(p[row * 11], 1);
    EXPECT_EQ(p[row * 11 + 10], 1);
  }
}

TEST(SparseAttention, BadArgumentsNameTheArgument) {
  const Tensor q = random_tensor({1, 3 * 16 * 16, 2, 8}, 1);
  const auto error = [&](ops::SparseAttentionOptions o, const Tensor& k) { return message_of([&] { ops::sparse_attention(q, k, k, o); }); };
  const auto base = [] { return rf_v2({3, 16, 16}, 0, 0.5); };
  auto o = base();
  o.sparsity = 1.5;
  EXPECT_NE(error(o, q).find("sparse_attention: sparsity must be in [0, 1], got 1.5"), std::string::npos);
  o.sparsity = std::nan("");
  EXPECT_NE(error(o, q).find("sparsity must be in [0, 1], got nan"), std::string::npos);
  o = base();
  o.sparsity = 1.0;
  EXPECT_NE(error(o, q).find("sparsity must be below 1 for rf_v2"), std::string::npos);
  o = base();
  o.latent_shape_q = ops::LatentShape{3, 16, 15};
  EXPECT_NE(error(o, q).find("latent_shape_q (3, 16, 15) holds 720 tokens, but the sequence has S - txt_len = 768 - 0 = 768"),
            std::string::npos);
  o = base();
  o.latent_shape_q.reset();
  EXPECT_NE(error(o, q).find("rf_v2 needs latent_shape_q (t, h, w)"), std::string::npos);
  o = base();
  o.block_size = 64;
  EXPECT_NE(error(o, q).find("block_size must be 128 (the only block size MindIE SD supports), got 64"), std::string::npos);
  o = base();
  o.txt_len = 769;
  EXPECT_NE(error(o, q).find("txt_len must be in [0, 768] (the sequence length), got 769"), std::string::npos);
  o = base();
  o.head_num = 3;
  EXPECT_NE(error(o, q).find("head_num 3 must equal the heads of q, 2"), std::string::npos);
  o = base();
  o.input_layout = AttentionLayout::bsh;
  EXPECT_NE(error(o, q).find("input_layout must be BSND or BNSD, got BSH"), std::string::npos);
  o = base();
  o.cdf_threshold = 0;
  EXPECT_NE(error(o, q).find("cdf_threshold must be in (0, 1], got 0"), std::string::npos);
  o = base();
  o.inner_precise = 7;
  EXPECT_NE(error(o, q).find("inner_precise must be 0 to 4, got 7"), std::string::npos);
  o = base();
  o.latent_shape_k = ops::LatentShape{3, 8, 32};
  EXPECT_NE(error(o, q).find("latent_shape_k (3, 8, 32) must equal latent_shape_q (3, 16, 16)"), std::string::npos);
  EXPECT_NE(error(base(), random_tensor({1, 768, 2, 16}, 2)).find("sparse attention is self-attention"), std::string::npos);
  o = rf_v2({1, 12, 64}, 0, 0.5);
  EXPECT_NE(error(o, q).find("latent_shape_q (1, 12, 64): with h or w not a multiple of 8, rf_v2's reorder needs more than one frame"),
            std::string::npos);
  o.sparse_type = SparseType::ada_bsa;
  o.sparsity = 0.99;
  const Tensor long_q = random_tensor({1, 1400, 1, 8}, 3);
  EXPECT_NE(message_of([&] { ops::sparse_attention(long_q, long_q, long_q, o); }).find("sparsity 0.99 keeps no block in rows of 11 blocks"),
            std::string::npos);
  // 0.9 at L = 10 keeps int(10 * 0.1f) = 1 block (the double product would truncate to 0).
  o.sparsity = 0.9;
  const Tensor q1280 = random_tensor({1, 1280, 1, 8}, 3);
  EXPECT_NO_THROW(ops::sparse_attention(q1280, q1280, q1280, o));
  EXPECT_NE(message_of([] { ops::parse_sparse_type("rf_v3"); }).find("rf_v2 with a mask reused across steps"), std::string::npos);
  EXPECT_NE(message_of([] { ops::parse_sparse_type("dense"); }).find("unknown sparse_type 'dense'"), std::string::npos);
}

}  // namespace sparse_attention_test
}  // namespace cubevec
