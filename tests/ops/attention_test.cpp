// Attention against a plain double-precision loop written here, at shapes that span many tiles
// (q-blocks of 4 x MR rows, key blocks of 128): every ISA's tile kernels, every implementation
// through the public API, masks (2-D, 4-D with broadcast dims, rows with nothing to attend to),
// varlen with and without causal; the CV pipeline with the Vector unit busy, two pipelines at
// once, and two lanes; simulate mode; and the argument errors.
//
// Tolerances (ref = the double loop on the same, possibly bf16-rounded, inputs; M = max |ref|):
//   f32:  |got - ref| <= 1e-5 * sqrt(Sk + D) * max(1, M)
//   bf16: |got - ref| <= 2^-7 * max(1, M)  (one rounding of the output plus the f32 sums)
//   rows with no key to attend to must be NaN in both.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <future>
#include <limits>
#include <random>
#include <thread>

#include "device/device.h"
#include "ops/attention.h"
#include "ops/attention/cv_pipeline.h"
#include "ops/attention/flash_tiles.h"
#include "ops/attention/problem.h"
#include "tensor/half.h"

#include "common/amx_model_scope.h"
#include "common/attention_reference.h"
#include "common/tensor_testing.h"
#include "device/device_test_util.h"

namespace cubevec {
namespace attention_test {  // named after the file: unity batches never mix two files' helpers

using namespace cubevec::testing;
using ops::AttentionImpl;
using ops::AttentionLayout;

const AttentionImpl kImpls[] = {AttentionImpl::math, AttentionImpl::flash, AttentionImpl::cv_pipelined};

// --- the tile kernels of every ISA, through run_flash on hand-made heads --------------------------

// Hand-made single heads around the tile edges: q-blocks of 56 (AVX-512) / 24 (AVX2) / 16
// (portable) / 128 (AMX, panels of 32) rows, key blocks of 128, QK panels of 32 / 16 keys, PV
// panels of 32+16 / 16+8 columns, AMX's head dims padded to 32; head dims with every tail.
struct EdgeCase {
  int64_t sq, sk, d;
  bool mask, causal;
};
const EdgeCase kEdgeCases[] = {{1, 1, 1, false, false},     {57, 129, 72, false, false},  {113, 257, 128, true, false},
                               {200, 130, 17, false, true}, {24, 300, 96, true, true},    {70, 40, 130, false, false},
                               {3, 511, 33, true, false},   {128, 128, 64, false, true},  {90, 60, 7, false, true},
                               {33, 129, 72, false, false}, {129, 257, 128, true, false}, {97, 60, 7, false, true}};

std::string edge_name(const EdgeCase& c, const std::string& kernel, DType dtype) {
  return kernel + " " + std::string(dtype_name(dtype)) + " sq=" + std::to_string(c.sq) + " sk=" + std::to_string(c.sk) +
         " d=" + std::to_string(c.d) + (c.mask ? " mask" : "") + (c.causal ? " causal" : "");
}

// One head of x (B = N = 1) as the kernels take it, writing into `out` [sq, d].
ops::attn::AttentionBatch one_head(const EdgeCase& c, const Qkv& x, const std::vector<uint8_t>& mask, DType dtype, Tensor& out) {
  ops::attn::AttentionBatch batch;
  batch.d = c.d;
  batch.dtype = dtype;
  batch.scale = 0.37f;
  ops::attn::HeadProblem h;
  h.q = x.q.data_ptr();
  h.k = x.k.data_ptr();
  h.v = x.v.data_ptr();
  h.out = out.mutable_data_ptr();
  h.q_ld = h.k_ld = h.v_ld = h.out_ld = c.d;
  h.sq = c.sq;
  h.sk = c.sk;
  h.mask = c.mask ? mask.data() : nullptr;
  h.mask_ld = c.sk;
  h.causal = c.causal;
  batch.heads.push_back(h);
  return batch;
}

TEST(AttentionFlash, EveryIsaMatchesTheDoubleLoop) {
  for (ops::Isa isa : {ops::Isa::avx512, ops::Isa::avx2, ops::Isa::portable}) {
    if (!ops::isa_supported(isa)) continue;
    const ops::attn::TileKernels& kernels = ops::attn::tile_kernels(isa);
    for (DType dtype : {DType::f32, DType::bf16}) {
      unsigned seed = 100;
      for (const EdgeCase& c : kEdgeCases) {
        const Qkv x = make_qkv(1, c.sq, c.sk, 1, c.d, dtype, seed += 10);
        const std::vector<uint8_t> mask = random_mask(c.sq * c.sk, seed, 0.7);
        Tensor out = Tensor::empty({c.sq, c.d}, dtype);
        ops::attn::run_flash(one_head(c, x, mask, dtype, out), &kernels);
        const auto want =
            reference_head({c.sq, c.sk, c.d, x.qd.data(), x.kd.data(), x.vd.data(), c.mask ? mask.data() : nullptr, c.causal}, 0.37);
        expect_matches(values(out), want, dtype, c.sk, c.d, edge_name(c, std::string(ops::isa_name(isa)), dtype));
      }
    }
  }
}

// flash_bf16 on the same edges, both input dtypes, with each kind of product this CPU has (AMX-BF16
// tiles, AVX512-BF16 dot products): within the bf16 bound of the double loop on the operands as the
// products see them (f32 inputs rounded to bf16).
TEST(AttentionFlash, Bf16TilesMatchTheDoubleLoop) {
  const cubevec::testing::AmxModelWhereNoAmx amx_tiles;  // AMX on the tile model where the CPU has none
  if (!ops::attention_impl_available(AttentionImpl::flash_bf16)) {
    const Qkv x = make_qkv(1, 8, 8, 1, 16, DType::bf16, 3);
    EXPECT_NE(
        message_of([&] { ops::attention_forward(x.q, x.k, x.v, manual(AttentionImpl::flash_bf16)); }).find("flash_bf16 needs AMX-BF16"),
        std::string::npos);
    return;
  }
  auto rounded = [](std::vector<double> v) {
    for (double& e : v) e = bf16_to_f32(f32_to_bf16(static_cast<float>(e)));
    return v;
  };
  for (const ops::attn::Bf16Tiles tiles : {ops::attn::Bf16Tiles::amx, ops::attn::Bf16Tiles::avx512_bf16}) {
    const std::string name = tiles == ops::attn::Bf16Tiles::amx ? "flash_bf16 (AMX)" : "flash_bf16 (AVX512-BF16)";
    if (!ops::attn::bf16_tiles_available(tiles)) {
      EXPECT_NE(message_of([&] {
                  Tensor out = Tensor::empty({1, 8}, DType::f32);
                  const Qkv x = make_qkv(1, 1, 1, 1, 8, DType::f32, 3);
                  ops::attn::run_flash_amx(one_head({1, 1, 8, false, false}, x, {}, DType::f32, out), tiles);
                }).find("not available on this CPU"),
                std::string::npos)
          << name;
      continue;
    }
    for (DType dtype : {DType::f32, DType::bf16}) {
      unsigned seed = 300;
      for (const EdgeCase& c : kEdgeCases) {
        const Qkv x = make_qkv(1, c.sq, c.sk, 1, c.d, dtype, seed += 10);
        const std::vector<uint8_t> mask = random_mask(c.sq * c.sk, seed, 0.7);
        Tensor out = Tensor::empty({c.sq, c.d}, dtype);
        ops::attn::run_flash_amx(one_head(c, x, mask, dtype, out), tiles);
        const std::vector<double> q = rounded(x.qd), k = rounded(x.kd), v = rounded(x.vd);
        const auto want = reference_head({c.sq, c.sk, c.d, q.data(), k.data(), v.data(), c.mask ? mask.data() : nullptr, c.causal}, 0.37);
        expect_matches(values(out), want, DType::bf16, c.sk, c.d, edge_name(c, name, dtype));
      }
    }
  }
}

// flash_int8's operands as it forms them, quantized by this test's own loop (SageAttention's
// scheme as ops/attention.h states it): K minus its channel means over the head's finite keys, one
// symmetric int8 scale per 128-key block; Q one scale per 32-row panel; V rounded to bf16. The
// dequantized values, q_int x q_scale and k_int x k_scale, as double.
struct Int8Operands {
  std::vector<double> q, k, v;
};
Int8Operands int8_operands(const EdgeCase& c, const Qkv& x) {
  auto quantize_groups = [&](std::vector<float> vals, int64_t rows, int64_t group) {
    std::vector<double> out(vals.size());
    for (int64_t g0 = 0; g0 < rows; g0 += group) {
      const int64_t g1 = std::min(rows, g0 + group);
      float amax = 0;
      for (int64_t i = g0 * c.d; i < g1 * c.d; ++i) amax = std::max(amax, std::fabs(vals[i]));
      const float scale = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
      for (int64_t i = g0 * c.d; i < g1 * c.d; ++i)
        out[i] = std::nearbyint(std::clamp(vals[i] * inv, -127.0f, 127.0f)) * static_cast<double>(scale);
    }
    return out;
  };
  std::vector<float> q(x.qd.begin(), x.qd.end()), k(x.kd.begin(), x.kd.end());
  for (int64_t ch = 0; ch < c.d; ++ch) {
    double sum = 0;
    for (int64_t j = 0; j < c.sk; ++j) sum += x.kd[j * c.d + ch];
    const float mean = static_cast<float>(sum / static_cast<double>(c.sk));
    for (int64_t j = 0; j < c.sk; ++j) k[j * c.d + ch] -= mean;
  }
  Int8Operands o{quantize_groups(q, c.sq, 32), quantize_groups(k, c.sk, 128), x.vd};
  for (double& e : o.v) e = bf16_to_f32(f32_to_bf16(static_cast<float>(e)));
  return o;
}

// K uniform in [2, 6]: a shared offset of 4 (what the smoothing takes out) around a spread of 2.
Qkv offset_qkv(int64_t sq, int64_t sk, int64_t d, DType dtype, unsigned seed) {
  Qkv x = make_qkv(1, sq, sk, 1, d, dtype, seed);
  x.k = random_tensor({1, sk, 1, d}, seed + 1, dtype, 2.0f, 4.0f);
  x.kd = values(x.k);
  return x;
}

// flash_int8 on the same edges, both input dtypes, with each kind of product this CPU has (AMX-INT8
// and AMX-BF16 tiles; AVX512-VNNI and AVX512-BF16 dot products, whose u8 x s8 products need Q
// shifted by 128 and each key's sum): within the bf16 bound of the double loop on the operands as
// quantized above (the int8 rounding itself is the test's, not the kernel's; one tie rounded the
// other way moves a score by one q_scale x k_scale).
TEST(AttentionFlash, Int8TilesMatchTheDoubleLoopOnTheQuantizedOperands) {
  const cubevec::testing::AmxModelWhereNoAmx amx_tiles;  // AMX on the tile model where the CPU has none
  if (!ops::attention_impl_available(AttentionImpl::flash_int8)) {
    const Qkv x = make_qkv(1, 8, 8, 1, 16, DType::bf16, 3);
    EXPECT_NE(
        message_of([&] { ops::attention_forward(x.q, x.k, x.v, manual(AttentionImpl::flash_int8)); }).find("flash_int8 needs AMX-INT8"),
        std::string::npos);
  }
  for (const ops::attn::Int8Tiles tiles : {ops::attn::Int8Tiles::amx, ops::attn::Int8Tiles::avx512_vnni}) {
    const std::string name = tiles == ops::attn::Int8Tiles::amx ? "flash_int8 (AMX)" : "flash_int8 (AVX512-VNNI)";
    if (!ops::attn::int8_tiles_available(tiles)) {
      EXPECT_NE(message_of([&] {
                  Tensor out = Tensor::empty({1, 8}, DType::f32);
                  const Qkv x = make_qkv(1, 1, 1, 1, 8, DType::f32, 3);
                  ops::attn::run_flash_int8(one_head({1, 1, 8, false, false}, x, {}, DType::f32, out), tiles);
                }).find("not available on this CPU"),
                std::string::npos)
          << name;
      continue;
    }
    for (DType dtype : {DType::f32, DType::bf16}) {
      unsigned seed = 500;
      for (const EdgeCase& c : kEdgeCases) {
        const Qkv x = c.sk > 200 ? offset_qkv(c.sq, c.sk, c.d, dtype, seed += 10) : make_qkv(1, c.sq, c.sk, 1, c.d, dtype, seed += 10);
        const std::vector<uint8_t> mask = random_mask(c.sq * c.sk, seed, 0.7);
        Tensor out = Tensor::empty({c.sq, c.d}, dtype);
        ops::attn::run_flash_int8(one_head(c, x, mask, dtype, out), tiles);
        const Int8Operands o = int8_operands(c, x);
        const auto want =
            reference_head({c.sq, c.sk, c.d, o.q.data(), o.k.data(), o.v.data(), c.mask ? mask.data() : nullptr, c.causal}, 0.37);
        expect_matches(values(out), want, DType::bf16, c.sk, c.d, edge_name(c, name, dtype));
      }
    }
  }
}

// Against exact attention on the unquantized inputs: the quantization's own error, stated. With a
// shared K offset of 4 (x2 the values' spread), the smoothing keeps the int8 steps on the spread,
// not on the offset: relative error (max |got - exact| / max |exact|) at most 2% and cosine at
// least 0.999 per head, at Flux's head dim and a length spanning 18 key blocks.
TEST(AttentionForward, Int8StaysCloseToExactAttention) {
  if (!ops::attention_impl_available(AttentionImpl::flash_int8)) GTEST_SKIP() << "no AMX-INT8 or AVX512-VNNI with AVX512-BF16 on this CPU";
  const int64_t sq = 300, sk = 2300, d = 128;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Qkv x = offset_qkv(sq, sk, d, dtype, 77);
    const auto exact = reference_bsnd(x, 1, sq, sk, 1, d, nullptr, 1, 1, 1.0 / std::sqrt(double(d)));
    const auto got = values(ops::attention_forward(x.q, x.k, x.v, manual(AttentionImpl::flash_int8)));
    double err = 0, m = 0, dot = 0, gg = 0, ee = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      err = std::max(err, std::fabs(got[i] - exact[i]));
      m = std::max(m, std::fabs(exact[i]));
      dot += got[i] * exact[i], gg += got[i] * got[i], ee += exact[i] * exact[i];
    }
    const double cosine = dot / std::sqrt(gg * ee);
    std::printf("flash_int8 %s: max error %.4g of max %.4g, cosine %.6f\n", std::string(dtype_name(dtype)).c_str(), err, m, cosine);
    EXPECT_LE(err, 0.02 * m) << dtype_name(dtype);
    EXPECT_GE(cosine, 0.999) << dtype_name(dtype);
  }
}

// What int8 cannot carry, against f32 flash on the same inputs (NaN exactly where it is NaN, the
// rest within the case's share of the largest value): a query row or key holding a NaN or an
// infinity (their scores are computed in f32, so a -inf score drops a key where exact attention
// drops it), scales whose product overflows a float; and, held only to NaN where exact attention
// is NaN and finite elsewhere: subnormal Q (its few significant bits quantize coarsely, but its
// zeros stay zero) against large K, and K within a factor 2 of the float range (no smoothing).
TEST(AttentionForward, Int8OddInputsFollowExactAttention) {
  if (!ops::attention_impl_available(AttentionImpl::flash_int8)) GTEST_SKIP() << "no AMX-INT8 or AVX512-VNNI with AVX512-BF16 on this CPU";
  const int64_t sq = 70, sk = 200, d = 64;
  const Qkv x = make_qkv(1, sq, sk, 1, d, DType::f32, 9);
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string name;
    std::function<void(std::vector<float>& q, std::vector<float>& k)> edit;
    bool masked;
    double tolerance;
  };
  const Case cases[] = {
      {"non-finite q rows and k key, masked for some rows",
       [&](std::vector<float>& q, std::vector<float>& k) {
         q[5 * d + 3] = std::numeric_limits<float>::quiet_NaN();
         q[40 * d + 1] = inf;
         k[150 * d + 2] = -inf;  // rows with q[2] > 0 score -inf there: dropped, not NaN
         k[20 * d + 7] = inf;
       },
       true, 0.02},
      {"scales whose product overflows",
       [&](std::vector<float>& q, std::vector<float>& k) {
         for (int64_t i = 0; i < sq; ++i)
           for (int64_t c = 0; c < d; ++c) q[i * d + c] = c == 0 ? 1e22f : 0.0f;
         for (int64_t j = 0; j < sk; ++j)
           for (int64_t c = 0; c < d; ++c) k[j * d + c] = c == 1 ? (j % 2 ? 1e22f : -1e22f) : 0.0f;
       },
       false, 0.02},
      {"K near the float range",
       [&](std::vector<float>& q, std::vector<float>& k) {
         for (float& e : q) e *= 1e-38f;
         for (int64_t j = 0; j < sk; ++j) k[j * d] = j == 17 ? -3e38f : 3e38f;
       },
       false, INFINITY},
      {"subnormal Q, large K",
       [&](std::vector<float>& q, std::vector<float>& k) {
         for (float& e : q) e *= 1e-39f;
         for (float& e : k) e *= 1e38f;
         q[3] = 0.0f;
       },
       false, INFINITY},
  };
  std::vector<uint8_t> mask(static_cast<std::size_t>(sq * sk), 1);
  for (int64_t i = 60; i < sq; ++i) mask[i * sk + 150] = mask[i * sk + 20] = 0;
  for (const Case& c : cases) {
    std::vector<float> q(x.qd.begin(), x.qd.end()), k(x.kd.begin(), x.kd.end());
    c.edit(q, k);
    const Tensor qt = Tensor::from_vector(q, {1, sq, 1, d}), kt = Tensor::from_vector(k, {1, sk, 1, d});
    ops::AttentionOptions int8 = manual(AttentionImpl::flash_int8), exact = manual(AttentionImpl::flash);
    if (c.masked) int8.mask = exact.mask = bool_tensor(mask, {sq, sk});
    const auto got = values(ops::attention_forward(qt, kt, x.v, int8)), want = values(ops::attention_forward(qt, kt, x.v, exact));
    double m = 0;
    int nans = 0;
    for (double w : want)
      if (!std::isnan(w)) m = std::max(m, std::fabs(w));
      else ++nans;
    if (c.masked) {
      EXPECT_GT(nans, 0) << c.name << ": the case should hold NaN rows";
    }
    EXPECT_LT(nans, sq * d) << c.name << ": exact attention should have finite rows";
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(std::isnan(got[i]), std::isnan(want[i])) << c.name << " at " << i << ": " << got[i] << " against " << want[i];
      if (!std::isnan(want[i])) {
        ASSERT_TRUE(std::isfinite(got[i])) << c.name << " at " << i << ": " << got[i];
        if (std::isfinite(c.tolerance)) {
          ASSERT_NEAR(got[i], want[i], c.tolerance * std::max(m, 1e-30)) << c.name << " at " << i;
        }
      }
    }
  }
  // Past the int32 sums' head dims: a named error, not a wrong answer.
  const Tensor wide = Tensor::zeros({1, 1, 1, ops::attn::kFlashInt8MaxHeadDim + 1}, DType::f32);
  EXPECT_NE(message_of([&] { ops::attention_forward(wide, wide, wide, manual(AttentionImpl::flash_int8)); }).find("head dims up to 65536"),
            std::string::npos);
}

// --- the public API, every implementation -----------------------------------------------------------

TEST(AttentionForward, EveryImplementationMatchesTheDoubleLoopOnManyTiles) {
  const int64_t b = 2, sq = 131, sk = 260, n = 2, d = 72;
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Qkv x = make_qkv(b, sq, sk, n, d, dtype, 7);
    // A [B, 1, Sq, Sk] mask with a fully masked row in batch 1.
    std::vector<uint8_t> mask = random_mask(b * sq * sk, 8, 0.6);
    for (int64_t j = 0; j < sk; ++j) mask[(1 * sq + 5) * sk + j] = 0;
    const Tensor mask_t = bool_tensor(mask, {b, 1, sq, sk});
    const auto want_masked = reference_bsnd(x, b, sq, sk, n, d, &mask, b, 1, 1.0 / std::sqrt(72.0));
    const auto want_plain = reference_bsnd(x, b, sq, sk, n, d, nullptr, 1, 1, 0.25);
    for (AttentionImpl impl : with_flash_bf16({std::begin(kImpls), std::end(kImpls)}, dtype)) {
      for (AttentionLayout kl : {AttentionLayout::bnsd, AttentionLayout::bsnd}) {
        const std::string what = std::string(ops::attention_impl_name(impl)) + "/" + std::string(ops::attention_layout_name(kl)) + " " +
                                 std::string(dtype_name(dtype));
        ops::AttentionOptions o = manual(impl, kl);
        o.mask = mask_t;
        const auto got = values(ops::attention_forward(x.q, x.k, x.v, o));
        // The math path rounds its intermediates in bf16 (MindIE's semantics): a wider bound.
        if (impl == AttentionImpl::math && dtype == DType::bf16) {
          for (std::size_t i = 0; i < got.size(); ++i) {
            if (std::isnan(want_masked[i])) ASSERT_TRUE(std::isnan(got[i])) << what << " at " << i;
            else ASSERT_NEAR(got[i], want_masked[i], 0.04) << what << " at " << i;
          }
        } else {
          expect_matches(got, want_masked, dtype, sk, d, what + " masked");
        }
        if (impl == AttentionImpl::math) continue;
        ops::AttentionOptions plain = manual(impl, kl);
        plain.scale = 0.25;
        expect_matches(values(ops::attention_forward(x.q, x.k, x.v, plain)), want_plain, dtype, sk, d, what + " scale 0.25");
      }
    }
  }
}

TEST(AttentionForward, LayoutsAndStridedInputsGiveTheSameResult) {
  const int64_t b = 1, sq = 60, sk = 45, n = 3, d = 40;
  const Qkv x = make_qkv(b, sq, sk, n, d, DType::f32, 21);
  const auto want = reference_bsnd(x, b, sq, sk, n, d, nullptr, 1, 1, 1.0 / std::sqrt(40.0));
  for (AttentionImpl impl : kImpls) {
    const std::string what(ops::attention_impl_name(impl));
    // BNSD input: the result comes back in BNSD.
    ops::AttentionOptions o = manual(impl);
    o.layout = AttentionLayout::bnsd;
    const Tensor out_bnsd = ops::attention_forward(x.q.permute({0, 2, 1, 3}).contiguous(), x.k.permute({0, 2, 1, 3}).contiguous(),
                                                   x.v.permute({0, 2, 1, 3}).contiguous(), o);
    ASSERT_EQ(out_bnsd.shape(), (Shape{b, n, sq, d}));
    expect_matches(values(out_bnsd.permute({0, 2, 1, 3})), want, DType::f32, sk, d, what + " BNSD");
    // BSH input.
    o.layout = AttentionLayout::bsh;
    o.num_heads = n;
    const Tensor out_bsh = ops::attention_forward(x.q.reshape({b, sq, n * d}), x.k.reshape({b, sk, n * d}), x.v.reshape({b, sk, n * d}), o);
    ASSERT_EQ(out_bsh.shape(), (Shape{b, sq, n * d}));
    expect_matches(values(out_bsh), want, DType::f32, sk, d, what + " BSH");
    // BSND views that are not contiguous (the head dim strided): copied before the kernel.
    const Tensor qs = strided_copy_of(x.q), ks = strided_copy_of(x.k), vs = strided_copy_of(x.v);
    expect_matches(values(ops::attention_forward(qs, ks, vs, manual(impl))), want, DType::f32, sk, d, what + " strided");
  }
}

TEST(AttentionForward, TwoDimensionalMaskAppliesToEveryHead) {
  const int64_t b = 2, sq = 70, sk = 150, n = 2, d = 24;
  const Qkv x = make_qkv(b, sq, sk, n, d, DType::f32, 31);
  const std::vector<uint8_t> mask = random_mask(sq * sk, 32, 0.3);
  const auto want = reference_bsnd(x, b, sq, sk, n, d, &mask, 1, 1, 1.0 / std::sqrt(24.0));
  for (AttentionImpl impl : kImpls) {
    ops::AttentionOptions o = manual(impl);
    o.mask = bool_tensor(mask, {sq, sk});
    expect_matches(values(ops::attention_forward(x.q, x.k, x.v, o)), want, DType::f32, sk, d, std::string(ops::attention_impl_name(impl)));
  }
}

// --- varlen -----------------------------------------------------------------------------------------

TEST(AttentionVarlen, EveryImplementationMatchesTheDoubleLoopWithAndWithoutCausal) {
  // Sequences (q len, k len): long ones over many tiles, single tokens, an empty one, and causal
  // rows that see no key at all (q longer than k: the first rows are NaN under causal).
  const std::vector<std::pair<int64_t, int64_t>> seqs = {{200, 300}, {1, 1}, {0, 0}, {130, 130}, {64, 10}, {5, 140}};
  const int64_t n = 2, d = 48;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (const auto& [a, c] : seqs) {
    cu_q.push_back(cu_q.back() + static_cast<int32_t>(a));
    cu_k.push_back(cu_k.back() + static_cast<int32_t>(c));
  }
  const int64_t tq = cu_q.back(), tk = cu_k.back();
  const Tensor q = random_tensor({tq, n, d}, 41, DType::f32, 2.0f), k = random_tensor({tk, n, d}, 42, DType::f32, 2.0f),
               v = random_tensor({tk, n, d}, 43, DType::f32, 1.0f);
  const auto qd = values(q), kd = values(k), vd = values(v);
  const Tensor cq = Tensor::from_vector(cu_q, {static_cast<int64_t>(cu_q.size())});
  const Tensor ck = Tensor::from_vector(cu_k, {static_cast<int64_t>(cu_k.size())});
  for (bool causal : {false, true}) {
    std::vector<double> want(static_cast<std::size_t>(tq * n * d));
    for (std::size_t s = 0; s < seqs.size(); ++s) {
      const int64_t sq = seqs[s].first, sk = seqs[s].second;
      for (int64_t h = 0; h < n; ++h) {
        std::vector<double> qh(static_cast<std::size_t>(sq * d)), kh(static_cast<std::size_t>(sk * d)), vh(kh.size());
        for (int64_t i = 0; i < sq; ++i)
          for (int64_t c = 0; c < d; ++c) qh[i * d + c] = qd[((cu_q[s] + i) * n + h) * d + c];
        for (int64_t j = 0; j < sk; ++j)
          for (int64_t c = 0; c < d; ++c) {
            kh[j * d + c] = kd[((cu_k[s] + j) * n + h) * d + c];
            vh[j * d + c] = vd[((cu_k[s] + j) * n + h) * d + c];
          }
        const auto o = reference_head({sq, sk, d, qh.data(), kh.data(), vh.data(), nullptr, causal}, 0.2);
        for (int64_t i = 0; i < sq; ++i)
          for (int64_t c = 0; c < d; ++c) want[((cu_q[s] + i) * n + h) * d + c] = o[i * d + c];
      }
    }
    for (AttentionImpl impl : kImpls) {
      ops::VarlenOptions o;
      o.causal = causal;
      o.scale = 0.2;
      o.impl = impl;
      expect_matches(values(ops::attention_forward_varlen(q, k, v, cq, ck, o)), want, DType::f32, 300, d,
                     std::string(ops::attention_impl_name(impl)) + (causal ? " causal" : ""));
    }
  }
}

// --- the CV pipeline when the units are not both free ----------------------------------------------

Tensor run_with_timeout(const std::function<Tensor()>& fn, const char* what) {
  auto future = std::async(std::launch::async, fn);
  if (future.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << what << ": did not finish within 60 s (deadlock?)";
    std::abort();  // the stuck threads cannot be joined
  }
  return future.get();
}

TEST(AttentionCvPipeline, FinishesCorrectlyWhileTheVectorUnitIsBusy) {
  Device device(builtin_cpu_profile());
  const Stream main = device.new_stream("main"), other = device.new_stream("other");
  const int64_t sq = 300, sk = 400, n = 2, d = 64;
  const Qkv x = make_qkv(1, sq, sk, n, d, DType::f32, 51);
  const auto want = reference_bsnd(x, 1, sq, sk, n, d, nullptr, 1, 1, 0.125);
  // A long kernel holds the Vector unit: the Cube half must not wait for its partner.
  testing_ops::fill(other, {16}, 1.0f, Unit::vector, 300);
  const Tensor out = run_with_timeout(
      [&] {
        // BSND in and to the kernel: no layout copies, which would queue behind the busy unit.
        Tensor t = ops::attention_forward(x.q, x.k, x.v, manual(AttentionImpl::cv_pipelined, AttentionLayout::bsnd), main);
        t.data_ptr();
        return t;
      },
      "cv_pipelined with a busy Vector unit");
  expect_matches(values(out), want, DType::f32, sk, d, "busy vector unit");
  const auto stats = ops::attn::last_cv_pipeline_stats();
  EXPECT_GT(stats.tiles, 0);
  EXPECT_LT(stats.vector_tiles, stats.tiles) << "the Cube side should have done the softmax while the Vector unit was busy";
}

// Two CV-pipelined calls racing on two streams, each with `lanes` Cube threads (one lane each).
void two_calls_at_once(int lanes) {
  DeviceProfile profile = builtin_cpu_profile();
  profile.cube_threads = lanes;
  Device device(profile);
  const int64_t sq = 250, sk = 260, n = 3, d = 32;
  const Qkv x = make_qkv(1, sq, sk, n, d, DType::f32, 61), y = make_qkv(1, sq, sk, n, d, DType::f32, 71);
  const auto want_x = reference_bsnd(x, 1, sq, sk, n, d, nullptr, 1, 1, 1.0 / std::sqrt(32.0));
  const auto want_y = reference_bsnd(y, 1, sq, sk, n, d, nullptr, 1, 1, 1.0 / std::sqrt(32.0));
  for (int round = 0; round < 3; ++round) {
    const Stream s1 = device.new_stream("one"), s2 = device.new_stream("two");
    Tensor a, b;
    run_with_timeout(
        [&] {
          auto fa = std::async(std::launch::async, [&] {
            for (int i = 0; i < 3; ++i) a = ops::attention_forward(x.q, x.k, x.v, manual(AttentionImpl::cv_pipelined), s1);
          });
          auto fb = std::async(std::launch::async, [&] {
            for (int i = 0; i < 3; ++i) b = ops::attention_forward(y.q, y.k, y.v, manual(AttentionImpl::cv_pipelined), s2);
          });
          fa.get();
          fb.get();
          device.synchronize();
          return a;
        },
        "two concurrent cv_pipelined calls");
    expect_matches(values(a), want_x, DType::f32, sk, d, "stream one");
    expect_matches(values(b), want_y, DType::f32, sk, d, "stream two");
  }
}

// The one-lane form is the one ThreadSanitizer runs in CI (.ci/run): with more than one thread per
// unit, TBB's work stealing (uninstrumented libtbb) shows up as false races.
TEST(AttentionCvPipeline, TwoCallsOnTwoStreamsAtOnceOneLane) { two_calls_at_once(1); }
TEST(AttentionCvPipeline, TwoCallsOnTwoStreamsAtOnceTwoLanes) { two_calls_at_once(2); }

// --- simulate mode ----------------------------------------------------------------------------------

TEST(AttentionForward, SimulateModeRecordsTheModelledKernels) {
  Device device(builtin_cpu_profile(), {.simulate = true, .trace = true});
  const Stream stream = device.default_stream();
  const int64_t b = 1, s = 4608, n = 24, d = 128;
  const Tensor q = Tensor::meta({b, s, n, d}, DType::bf16), k = Tensor::meta({b, s, n, d}, DType::bf16),
               v = Tensor::meta({b, s, n, d}, DType::bf16);
  const Tensor out = ops::attention_forward(q, k, v, {}, stream);  // runtime mode: no tuning here
  EXPECT_EQ(out.shape(), q.shape());
  EXPECT_FALSE(out.has_storage());
  ops::attention_forward(q, k, v, manual(AttentionImpl::cv_pipelined, AttentionLayout::bsnd), stream);
  device.synchronize();
  const auto records = device.trace().records();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].desc.name, "attention_flash");
  EXPECT_EQ(records[0].desc.unit, Unit::cube);
  EXPECT_DOUBLE_EQ(records[0].desc.flops, 4.0 * b * n * s * s * d);
  EXPECT_EQ(records[1].desc.name, "attention_cv_softmax");
  EXPECT_EQ(records[1].desc.unit, Unit::vector);
  EXPECT_EQ(records[2].desc.name, "attention_cv_matmul");
  for (const auto& r : records) EXPECT_FALSE(r.ran);
  EXPECT_GT(device.stats().modelled_makespan_s, 0.0);
}

// --- errors -----------------------------------------------------------------------------------------

TEST(AttentionForward, BadArgumentsGiveClearErrors) {
  const Tensor q = random_tensor({1, 8, 2, 16}, 1), k = random_tensor({1, 6, 2, 16}, 2), v = random_tensor({1, 6, 2, 16}, 3);
  auto run = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv, ops::AttentionOptions o = {}) {
    return message_of([&] { ops::attention_forward(qq, kk, vv, o); });
  };
  auto with_mask = [](const Tensor& m) {
    ops::AttentionOptions o = manual(AttentionImpl::flash);
    o.mask = m;
    return o;
  };
  const struct {
    std::string got, expected;
  } cases[] = {
      {run(random_tensor({8, 2, 16}, 4), k, v), "query must be 4-D [B, S, N, D] for layout BSND, got f32 [8, 2, 16]"},
      {run(q, random_tensor({1, 6, 2, 16}, 5, DType::bf16), v), "query, key and value must share a dtype"},
      {run(random_tensor({1, 8, 2, 16}, 6, DType::f16), k, v), "query must be f32 or bf16, got f16 [1, 8, 2, 16]"},
      {run(q, k, random_tensor({1, 7, 2, 16}, 7)), "key and value must have the same shape"},
      {run(q, random_tensor({1, 6, 2, 8}, 8), random_tensor({1, 6, 2, 8}, 9)), "key must match query in batch, heads and head dim"},
      {run(q, random_tensor({1, 6, 3, 16}, 8), random_tensor({1, 6, 3, 16}, 9)), "key must match query in batch, heads and head dim"},
      {run(q, random_tensor({1, 0, 2, 16}, 8), random_tensor({1, 0, 2, 16}, 9)), "key and value must hold at least one position"},
      {run(q.reshape({1, 8, 32}), k.reshape({1, 6, 32}), v.reshape({1, 6, 32}),
           [] {
             ops::AttentionOptions o;
             o.layout = AttentionLayout::bsh;
             return o;
           }()),
       "layout BSH needs num_heads > 0, got 0"},
      {run(q.reshape({1, 8, 32}), k.reshape({1, 6, 32}), v.reshape({1, 6, 32}),
           [] {
             ops::AttentionOptions o;
             o.layout = AttentionLayout::bsh;
             o.num_heads = 3;
             return o;
           }()),
       "query's hidden size 32 is not divisible by num_heads 3"},
      {run(q, k, v, with_mask(random_tensor({8, 6}, 10, DType::bf16))),
       "attn_mask must be bool (true = attend) or f32 (added to the scaled scores), got bf16 [8, 6]"},
      {run(q, k, v, with_mask(bool_tensor(std::vector<uint8_t>(48, 1), {6, 8}))),
       "a 2-D attn_mask must be [Sq, Sk] = [8, 6], got bool [6, 8]"},
      {run(q, k, v, with_mask(bool_tensor(std::vector<uint8_t>(48, 1), {1, 8, 6}))),
       "attn_mask must be 2-D [Sq, Sk] or 4-D [B, N, Sq, Sk], got bool [1, 8, 6]"},
      {run(q, k, v, with_mask(bool_tensor(std::vector<uint8_t>(144, 1), {1, 3, 8, 6}))),
       "a 4-D attn_mask must be [B, N, Sq, Sk] = [1, 2, 8, 6] (B and N may be 1), got bool [1, 3, 8, 6]"},
      {run(q, k, v,
           [] {
             ops::AttentionOptions o;
             o.scale = std::numeric_limits<double>::quiet_NaN();
             return o;
           }()),
       "scale must be a finite number"},
      {run(q, k, v, manual(AttentionImpl::flash, AttentionLayout::bsh)), "kernel_layout BSH needs BSH input (layout BSND given)"},
      {message_of([] { ops::parse_attention_layout("SBH"); }), "unknown attention layout 'SBH' (expected one of: BSND, BNSD, BSH)"},
      {message_of([] { ops::parse_attention_impl("laser"); }),
       "unknown attention op_type 'laser' (expected one of: math, flash, cv_pipelined, flash_bf16, flash_int8)"},
      {message_of([] { ops::parse_attention_opt_mode("auto"); }),
       "unknown attention opt_mode 'auto' (expected one of: runtime, static, manual)"},
  };
  for (const auto& c : cases) EXPECT_NE(c.got.find(c.expected), std::string::npos) << "got: " << c.got << "\nexpected: " << c.expected;
}

TEST(AttentionVarlen, InvalidCuSeqlensGiveClearErrors) {
  const Tensor q = random_tensor({10, 2, 8}, 1), k = random_tensor({12, 2, 8}, 2), v = random_tensor({12, 2, 8}, 3);
  auto cu = [](std::vector<int32_t> x) { return Tensor::from_vector(x, {static_cast<int64_t>(x.size())}); };
  auto run = [&](const Tensor& cq, const Tensor& ck, const Tensor& qq) {
    return message_of([&] { ops::attention_forward_varlen(qq, k, v, cq, ck); });
  };
  const struct {
    std::string got, expected;
  } cases[] = {
      {run(cu({0, 4, 3, 10}), cu({0, 4, 8, 12}), q), "cu_seqlens_q must be non-decreasing, but entry 2 (3) is below entry 1 (4)"},
      {run(cu({0, 4, 9}), cu({0, 4, 12}), q), "cu_seqlens_q must end at the token count 10, got 9"},
      {run(cu({1, 4, 10}), cu({0, 4, 12}), q), "cu_seqlens_q must start at 0, got 1"},
      {run(cu({0, 4, 10}), cu({0, 4, 13}), q), "cu_seqlens_k must end at the token count 12, got 13"},
      {run(cu({0, 4, 10}), cu({0, 2, 6, 12}), q), "cu_seqlens_q and cu_seqlens_k must have the same length, got 3 and 4"},
      {run(cu({0, 4, 10}), cu({0, 12, 12}), q), "sequence 1 has 6 queries but no keys"},
      {run(Tensor::from_vector(std::vector<int64_t>{0, 10}, {2}), cu({0, 12}), q),
       "cu_seqlens_q must be int32 [B+1] with B >= 1, got i64 [2]"},
      {run(cu({0}), cu({0, 12}), q), "cu_seqlens_q must be int32 [B+1] with B >= 1, got i32 [1]"},
      {run(cu({0, 10}), cu({0, 12}), random_tensor({1, 10, 2, 8}, 4)), "q must be 3-D [T, N, D], got f32 [1, 10, 2, 8]"},
  };
  for (const auto& c : cases) EXPECT_NE(c.got.find(c.expected), std::string::npos) << "got: " << c.got << "\nexpected: " << c.expected;
}

}  // namespace attention_test
}  // namespace cubevec
