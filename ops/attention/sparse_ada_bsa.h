// ada_bsa's block estimate (ops/sparse_attention.h), after MindIE SD's sparse_block_estimate kernel
// (csrc/ops/sparse_block_estimate/op_kernel/sparse_block_estimate.h), non-causal, on plain arrays.
#pragma once

#include <cstdint>

namespace cubevec::ops::attn::ada_bsa {

// threshold and row_sparse are float32, as the kernel's attributes are: MindIE passes Python
// doubles (row_sparse = 1.0 - sparsity) that arrive rounded to float.
struct Params {
  float scale = 1.0f;       // the attention's scale (the estimate uses scale / 8)
  float threshold = 1;      // cdf_threshold: < 1 keeps the smallest set reaching that mass
  bool keep_sink = true;    // force key block 0
  bool keep_recent = true;  // (non-causal: the last key block is forced whatever this says)
  float row_sparse = 1;     // 1 - sparsity: rows of L >= 10 blocks keep at most capped_count(L)
};

// The estimate's parameters from sparse_attention's arguments, rounded as MindIE's call rounds them.
Params make_params(float scale, double cdf_threshold, bool keep_sink, bool keep_recent, double sparsity);

// The ranked blocks a capped row keeps: int(float(L) * row_sparse), the product in float32
// (L = 10, sparsity 0.8: 2, where the double product 1.9999999999999996 would give 1).
float cap_of(int64_t lk, float row_sparse);
int64_t capped_count(int64_t lk, float row_sparse);

// The estimated block scores of one head, [Lq, Lk] (Lq = ceil(sq / 128), Lk = ceil(sk / 128)):
// p[g, h] = (scale / 8) * sum_j q[8g + 7 - j] . k[8h + j] over ceil(sq / 8) query groups (the last
// zero-padded) and floor(sk / 8) key groups (the kernel drops the sk % 8 tail keys), softmax over
// h, summed over the 16 x 16 groups of each block. q, k: f32 rows of d with strides q_ld, k_ld.
void block_scores(const float* q, int64_t q_ld, int64_t sq, const float* k, int64_t k_ld, int64_t sk, int64_t d, float scale,
                  float* scores);

// One query block's decision from its Lk scores: keep[j] for j < Lk.
void select_row(const float* scores, int64_t lk, const Params& params, uint8_t* keep);

// The kept fraction the cost model assumes: with cdf_threshold 1, capped_count(L) blocks plus
// the forced ones per row when L >= 10, all of them below; with a threshold, that as a bound.
double expected_density(int64_t sk, const Params& params);

}  // namespace cubevec::ops::attn::ada_bsa
