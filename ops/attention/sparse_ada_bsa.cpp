#include "ops/attention/sparse_ada_bsa.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "ops/attention/problem.h"
#include "ops/gemm/driver.h"
#include "ops/vector_math.h"
#include "tensor/shape.h"

namespace cubevec::ops::attn::ada_bsa {

namespace {

constexpr int64_t kStride = 8;                               // tokens per group
constexpr int64_t kGroupsPerBlock = kSparseBlock / kStride;  // 16
constexpr int64_t kChunkGroups = 32 * kGroupsPerBlock;       // query groups per GEMM
constexpr double kEps = 1e-5;                                // the kernel's guard offset

}  // namespace

Params make_params(float scale, double cdf_threshold, bool keep_sink, bool keep_recent, double sparsity) {
  // row_sparse = 1.0 - sparsity is formed in double (Python) and only then rounded to float.
  return {scale, static_cast<float>(cdf_threshold), keep_sink, keep_recent, static_cast<float>(1.0 - sparsity)};
}

float cap_of(int64_t lk, float row_sparse) { return static_cast<float>(lk) * row_sparse; }

int64_t capped_count(int64_t lk, float row_sparse) { return static_cast<int64_t>(cap_of(lk, row_sparse)); }

void block_scores(const float* q, int64_t q_ld, int64_t sq, const float* k, int64_t k_ld, int64_t sk, int64_t d, float scale,
                  float* scores) {
  const int64_t gq = ceil_div(sq, kStride), gk = sk / kStride, lq = ceil_div(sq, kSparseBlock), lk = ceil_div(sk, kSparseBlock);
  const int64_t width = kStride * d;
  std::fill(scores, scores + lq * lk, 0.0f);
  if (gk == 0) return;  // no whole key group: every score is 0
  // K's groups as rows of 8d: the rows themselves when k is dense.
  std::vector<float> k_groups;
  const float* kg = k;
  if (k_ld != d) {
    k_groups.resize(static_cast<std::size_t>(gk * width));
    for (int64_t r = 0; r < gk * kStride; ++r) std::copy(k + r * k_ld, k + r * k_ld + d, k_groups.begin() + r * d);
    kg = k_groups.data();
  }
  gemm::Problem p;
  p.n = gk;
  p.k = width;
  p.b = kg;
  p.ldb = width;
  p.trans_b = true;
  const auto packed = gemm::pack_b_once(p, gemm::best_isa());
  p.packed_b = packed.get();
  const float scale_value = scale / static_cast<float>(kStride);
  // Chunks of 32 block rows in parallel: each writes its own rows of `scores`. Nested in the
  // caller's loop over heads, this keeps both threads busy when there are fewer heads than threads.
  const int64_t chunks = ceil_div(gq, kChunkGroups);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, chunks, 1), [&](const tbb::blocked_range<int64_t>& range) {
    std::vector<float> q_groups(static_cast<std::size_t>(kChunkGroups * width)), logits(static_cast<std::size_t>(kChunkGroups * gk));
    for (int64_t chunk = range.begin(); chunk < range.end(); ++chunk) {
      const int64_t g0 = chunk * kChunkGroups, groups = std::min(kChunkGroups, gq - g0);
      // Each query group reversed in itself: row g = [q[8g + 7], q[8g + 6], ..., q[8g]], zero past sq.
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t j = 0; j < kStride; ++j) {
          const int64_t row = (g0 + g) * kStride + (kStride - 1 - j);
          float* dst = q_groups.data() + g * width + j * d;
          if (row < sq) std::copy(q + row * q_ld, q + row * q_ld + d, dst);
          else std::fill(dst, dst + d, 0.0f);
        }
      gemm::Problem chunk_problem = p;
      chunk_problem.m = groups;
      chunk_problem.a = q_groups.data();
      chunk_problem.lda = width;
      chunk_problem.c = logits.data();
      chunk_problem.ldc = gk;
      gemm::sgemm(chunk_problem, gemm::best_isa(), 1);
      for (int64_t g = 0; g < groups; ++g) {
        float* row = logits.data() + g * gk;
        float mx = -INFINITY;
        for (int64_t h = 0; h < gk; ++h) mx = std::max(mx, row[h] *= scale_value);
        float sum = 0;
        for (int64_t h = 0; h < gk; ++h) sum += row[h] = vmath::exp(row[h] - mx);
        const float inv = 1.0f / sum;
        float* block_row = scores + ((g0 + g) / kGroupsPerBlock) * lk;
        for (int64_t h0 = 0; h0 < gk; h0 += kGroupsPerBlock) {
          float part = 0;
          for (int64_t h = h0; h < std::min(gk, h0 + kGroupsPerBlock); ++h) part += row[h];
          block_row[h0 / kGroupsPerBlock] += part * inv;
        }
      }
    }
  });
}

void select_row(const float* scores, int64_t lk, const Params& params, uint8_t* keep) {
  // Non-causal: the last block is always excluded from the ranking and forced; block 0 too with keep_sink.
  std::vector<float> v(scores, scores + lk);
  std::vector<int64_t> forced{lk - 1};
  if (params.keep_sink && lk > 1) forced.push_back(0);
  for (int64_t j : forced) v[static_cast<std::size_t>(j)] = 0.0f;
  float total = 0;
  for (float x : v) total += x;
  std::vector<float> sorted(static_cast<std::size_t>((lk + 31) / 32 * 32), 0.0f);  // zero-padded as the kernel's
  std::copy(v.begin(), v.end(), sorted.begin());
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  int64_t count = lk;  // the kernel's cnt: an index when the threshold cut it
  float guard = 0.0f;
  if (params.threshold < 1.0f) {
    const float target = params.threshold * total;
    // The first 16-wide piece that takes the prefix past the target, then the element inside it.
    float sum = 0;
    std::size_t piece = 0;
    bool crossed = false;
    for (std::size_t p = 0; p < sorted.size(); p += 16) {
      float part = 0;
      for (std::size_t i = p; i < p + 16 && i < sorted.size(); ++i) part += sorted[i];
      if (sum + part > target) {
        piece = p;
        crossed = true;
        break;
      }
      sum += part;
    }
    if (!crossed) piece = 0;  // rounding kept the mass below the target: the largest block decides
    for (std::size_t i = piece; i < piece + 16 && i < sorted.size(); ++i) {
      sum += sorted[i];
      guard = sorted[i];
      count = static_cast<int64_t>(i);
      if (sum >= target) break;
    }
  }
  // The cap compares the index with the float32 product: at L = 10, sparsity 0.8, a cut at index
  // 2 passes (2 > 2.0f is false) and a capped row keeps 2 ranked blocks.
  const float cap = cap_of(lk, params.row_sparse);
  if (static_cast<float>(count) > cap && lk >= 10) {
    // kk < 1 would read before the kernel's sorted array; check_sparse_attention refuses it.
    const int64_t kk = std::max<int64_t>(1, static_cast<int64_t>(cap));
    guard = sorted[static_cast<std::size_t>(kk - 1)];
  }
  guard -= static_cast<float>(kEps);
  for (int64_t j : forced) v[static_cast<std::size_t>(j)] = guard + 1.0f;
  for (int64_t j = 0; j < lk; ++j) keep[j] = v[static_cast<std::size_t>(j)] - guard > 0.0f ? 1 : 0;
  keep[0] = 1;
}

double expected_density(int64_t sk, const Params& params) {
  const int64_t lk = ceil_div(sk, kSparseBlock);
  if (lk < 10 || params.row_sparse >= 1.0f) return 1.0;
  const double l = static_cast<double>(lk);
  const double kk = static_cast<double>(std::max<int64_t>(1, capped_count(lk, params.row_sparse)));
  // The top kk of the ranked blocks, the last block (forced), and block 0 (forced with keep_sink,
  // otherwise kept anyway, counted when it is not among the top kk).
  const double per_row = kk + 1.0 + (params.keep_sink ? 1.0 : 1.0 - kk / l);
  return std::min(1.0, per_row / l);
}

}  // namespace cubevec::ops::attn::ada_bsa
