// The reference implementation, MindIE's attention_math: per head, the whole [sq, sk] score matrix
// is materialized, masked (or biased), soft-maxed and multiplied by V. bf16 rounds where MindIE's bf16 path
// does: q * scale, the scores (the matmul's bf16 result) and the probabilities.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>
#include <tbb/parallel_for.h>

#include "ops/attention/problem.h"
#include "ops/gemm/driver.h"
#include "tensor/half.h"

namespace cubevec::ops::attn {

namespace {

float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

void rows_as_f32(const void* base, int64_t ld, int64_t rows, int64_t d, DType dtype, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    if (dtype == DType::bf16) {
      convert_bf16_to_f32(static_cast<const uint16_t*>(base) + r * ld, out + r * d, static_cast<std::size_t>(d));
    } else {
      std::memcpy(out + r * d, static_cast<const float*>(base) + r * ld, static_cast<std::size_t>(d) * sizeof(float));
    }
  }
}

// C[m, n] = A[m, k] B where B is [n, k] (trans_b) or [k, n].
void matmul_f32(int64_t m, int64_t n, int64_t k, const float* a, const float* b, bool trans_b, float* c) {
  gemm::Problem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a = a;
  p.lda = k;
  p.b = b;
  p.ldb = trans_b ? k : n;
  p.trans_b = trans_b;
  p.c = c;
  p.ldc = n;
  gemm::sgemm(p, gemm::best_isa(), 1);
}

void math_head(const HeadProblem& h, int64_t d, DType dtype, float scale) {
  const bool bf16 = dtype == DType::bf16;
  std::vector<float> q(static_cast<std::size_t>(h.sq * d)), k(static_cast<std::size_t>(h.sk * d)), v(static_cast<std::size_t>(h.sk * d)),
      scores(static_cast<std::size_t>(h.sq * h.sk)), out(static_cast<std::size_t>(h.sq * d));
  rows_as_f32(h.q, h.q_ld, h.sq, d, dtype, q.data());
  rows_as_f32(h.k, h.k_ld, h.sk, d, dtype, k.data());
  rows_as_f32(h.v, h.v_ld, h.sk, d, dtype, v.data());
  for (float& x : q) x = bf16 ? round_bf16(x * scale) : x * scale;
  if (h.sk > 0) matmul_f32(h.sq, h.sk, d, q.data(), k.data(), true, scores.data());
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < h.sq; ++i) {
    float* row = scores.data() + i * h.sk;
    float mx = neg_inf;
    for (int64_t j = 0; j < h.sk; ++j) {
      const bool attend = (!h.mask || h.mask[i * h.mask_ld + j] != 0) && (!h.causal || j <= i + (h.sk - h.sq));
      row[j] = attend ? (bf16 ? round_bf16(row[j]) : row[j]) + (h.bias ? h.bias[i * h.bias_ld + j] : 0.0f) : neg_inf;
      mx = std::max(mx, row[j]);
    }
    // All keys masked: exp(-inf - -inf) is NaN, which is what MindIE's math path returns.
    double sum = 0;
    for (int64_t j = 0; j < h.sk; ++j) sum += row[j] = std::exp(row[j] - mx);
    const float inv = h.sk > 0 ? static_cast<float>(1.0 / sum) : std::numeric_limits<float>::quiet_NaN();
    for (int64_t j = 0; j < h.sk; ++j) row[j] = bf16 ? round_bf16(row[j] * inv) : row[j] * inv;
  }
  if (h.sk > 0) {
    matmul_f32(h.sq, d, h.sk, scores.data(), v.data(), false, out.data());
  } else {
    std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
  }
  for (int64_t i = 0; i < h.sq; ++i) {
    if (bf16) {
      convert_f32_to_bf16(out.data() + i * d, static_cast<uint16_t*>(h.out) + i * h.out_ld, static_cast<std::size_t>(d));
    } else {
      std::memcpy(static_cast<float*>(h.out) + i * h.out_ld, out.data() + i * d, static_cast<std::size_t>(d) * sizeof(float));
    }
  }
}

}  // namespace

void run_math(const AttentionBatch& batch) {
  tbb::parallel_for(std::size_t{0}, batch.heads.size(),
                    [&](std::size_t i) { math_head(batch.heads[i], batch.d, batch.dtype, batch.scale); });
}

}  // namespace cubevec::ops::attn
