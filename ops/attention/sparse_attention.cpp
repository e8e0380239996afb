// sparse_attention: argument checks (errors name the argument), the estimate kernels of rf_v2 and
// ada_bsa on the Cube unit, rf_v2's token reorder on the Vector unit, and the block-sparse kernel.
#include "ops/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "ops/attention/problem.h"
#include "ops/attention/sparse_ada_bsa.h"
#include "ops/attention/sparse_rf_v2.h"
#include "base/enum_names.h"
#include "base/error.h"
#include "tensor/half.h"

namespace cubevec::ops {

namespace {

constexpr auto kSparseTypeNames = enum_names<SparseType>(
    "sparse_type", {{SparseType::none, "none"}, {SparseType::rf_v2, "rf_v2"}, {SparseType::ada_bsa, "ada_bsa"}}, /*ignore_case=*/true);

std::string shape_text(const LatentShape& s) {
  return "(" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) + ")";
}
std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}

// Rows of head (b, n) of a 4-D tensor in `layout` (unit stride in D) as f32 [s, d], rows taken in
// `order` (all rows in order when null).
std::vector<float> head_rows(const Tensor& t, AttentionLayout layout, int64_t b, int64_t n, const std::vector<int32_t>* order) {
  const int64_t s = t.size(seq_dim(layout)), d = t.size(3), ld = t.stride(seq_dim(layout));
  const std::byte* base =
      t.unsynchronized_data_ptr() + (b * t.stride(0) + n * t.stride(head_dim_index(layout))) * static_cast<int64_t>(t.itemsize());
  std::vector<float> out(static_cast<std::size_t>(s * d));
  for (int64_t i = 0; i < s; ++i) {
    const int64_t row = order ? (*order)[static_cast<std::size_t>(i)] : i;
    if (t.dtype() == DType::bf16) {
      convert_bf16_to_f32(reinterpret_cast<const uint16_t*>(base) + row * ld, out.data() + i * d, static_cast<std::size_t>(d));
    } else {
      std::memcpy(out.data() + i * d, reinterpret_cast<const float*>(base) + row * ld, static_cast<std::size_t>(d) * sizeof(float));
    }
  }
  return out;
}

// x with its sequence positions taken in `order` (out[..., i, ...] = x[..., order[i], ...]).
Tensor reorder_tokens(const Tensor& x, AttentionLayout layout, std::shared_ptr<const std::vector<int32_t>> order, const char* name,
                      const Stream& stream) {
  const Tensor in = x.is_contiguous() ? x : x.contiguous();
  Tensor out = stream.device().empty(in.shape(), in.dtype(), stream);
  const int64_t sd = seq_dim(layout);
  const int64_t outer = layout == AttentionLayout::bnsd ? in.size(0) * in.size(1) : in.size(0);
  const int64_t s = in.size(sd), row = layout == AttentionLayout::bnsd ? in.size(3) : in.size(2) * in.size(3);
  const auto bytes = static_cast<std::size_t>(row) * in.itemsize();
  stream.launch({name, Unit::vector, 0.0, 2.0 * static_cast<double>(in.nbytes()), in.dtype()}, {in}, {out},
                [in, out, order, outer, s, bytes] {
                  const std::byte* src = in.unsynchronized_data_ptr();
                  std::byte* dst = out.unsynchronized_data_ptr();
                  tbb::parallel_for(tbb::blocked_range<int64_t>(0, outer * s), [&](const tbb::blocked_range<int64_t>& r) {
                    for (int64_t i = r.begin(); i < r.end(); ++i) {
                      const int64_t o = i / s, pos = i % s;
                      std::memcpy(dst + static_cast<std::size_t>(i) * bytes,
                                  src + static_cast<std::size_t>(o * s + (*order)[static_cast<std::size_t>(pos)]) * bytes, bytes);
                    }
                  });
                });
  return out;
}

// rf_v2's reorder of the whole sequence, and its inverse.
struct Reorder {
  std::shared_ptr<const std::vector<int32_t>> forward, inverse;
};
Reorder rf_v2_reorder(const SparseAttentionOptions& o) {
  auto forward = std::make_shared<std::vector<int32_t>>(attn::rf_v2::sequence_order(*o.latent_shape_q, o.txt_len));
  auto inverse = std::make_shared<std::vector<int32_t>>(forward->size());
  for (std::size_t i = 0; i < forward->size(); ++i) (*inverse)[static_cast<std::size_t>((*forward)[i])] = static_cast<int32_t>(i);
  return {forward, inverse};
}

float scale_of(const SparseAttentionOptions& o, int64_t d) {
  return static_cast<float>(o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(d)));
}

}  // namespace

SparseType parse_sparse_type(std::string_view name) {
  if (name == "rf_v3")
    throw Error("sparse_type 'rf_v3' is rf_v2 with a mask reused across steps: use rf_v2 (and the sparse stage's --sparse-mask-refresh)");
  return kSparseTypeNames.parse(name);
}
std::string_view sparse_type_name(SparseType type) { return kSparseTypeNames.name(type); }

SparseAttentionOptions check_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SparseAttentionOptions& options) {
  const auto fail = [](const std::string& what) { throw Error("sparse_attention: " + what); };
  SparseAttentionOptions o = options;
  if (o.input_layout != AttentionLayout::bsnd && o.input_layout != AttentionLayout::bnsd)
    fail("input_layout must be BSND or BNSD, got " + std::string(attention_layout_name(o.input_layout)));
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    if (!t->defined() || t->dim() != 4)
      fail(std::string(name) + " must be 4-D [" + (o.input_layout == AttentionLayout::bnsd ? "B, N, S, D" : "B, S, N, D") + "], got " +
           t->brief());
    if (t->dtype() != DType::f32 && t->dtype() != DType::bf16) fail(std::string(name) + " must be f32 or bf16, got " + t->brief());
  }
  const int64_t heads = q.size(head_dim_index(o.input_layout)), s = q.size(seq_dim(o.input_layout));
  if (o.head_num != 0 && o.head_num != heads)
    fail("head_num " + std::to_string(o.head_num) + " must equal the heads of q, " + std::to_string(heads) + " (" + q.brief() + ")");
  o.head_num = heads;
  if (o.block_size != 128) fail("block_size must be 128 (the only block size MindIE SD supports), got " + std::to_string(o.block_size));
  if (!std::isfinite(o.sparsity) || o.sparsity < 0.0 || o.sparsity > 1.0) fail("sparsity must be in [0, 1], got " + number(o.sparsity));
  if (!std::isfinite(o.cdf_threshold) || o.cdf_threshold <= 0.0 || o.cdf_threshold > 1.0)
    fail("cdf_threshold must be in (0, 1], got " + number(o.cdf_threshold));
  if (o.inner_precise < 0 || o.inner_precise > 4) fail("inner_precise must be 0 to 4, got " + std::to_string(o.inner_precise));
  if (o.scale && !std::isfinite(*o.scale)) fail("scale must be a finite number, got " + number(*o.scale));
  if (o.txt_len < 0 || o.txt_len > s)
    fail("txt_len must be in [0, " + std::to_string(s) + "] (the sequence length), got " + std::to_string(o.txt_len));
  if (o.sparse_type == SparseType::none) return o;
  if (q.shape() != k.shape() || q.shape() != v.shape() || q.dtype() != k.dtype() || q.dtype() != v.dtype())
    fail("sparse attention is self-attention: q, k and v must have one shape and dtype, got " + q.brief() + ", " + k.brief() + ", " +
         v.brief());
  if (q.size(3) == 0) fail("the head dim must be at least 1, got " + q.brief());
  if (o.sparse_type == SparseType::rf_v2) {
    if (!o.latent_shape_q) fail("rf_v2 needs latent_shape_q (t, h, w), the latent token grid of the S - txt_len image tokens");
    const LatentShape lq = *o.latent_shape_q;
    if (lq[0] < 1 || lq[1] < 1 || lq[2] < 1) fail("latent_shape_q must be positive, got " + shape_text(lq));
    const int64_t image = s - o.txt_len;
    int64_t tokens = 0;
    if (__builtin_mul_overflow(lq[0], lq[1], &tokens) || __builtin_mul_overflow(tokens, lq[2], &tokens))
      fail("latent_shape_q " + shape_text(lq) +
           " holds more than 2^63 tokens, but the sequence has S - txt_len = " + std::to_string(image));
    if (q.size(0) == 0) fail("rf_v2 takes every batch's mask from batch 0, so q needs at least one batch, got " + q.brief());
    if (tokens != image)
      fail("latent_shape_q " + shape_text(lq) + " holds " + std::to_string(tokens) + " tokens, but the sequence has S - txt_len = " +
           std::to_string(s) + " - " + std::to_string(o.txt_len) + " = " + std::to_string(image));
    if ((lq[1] % 8 != 0 || lq[2] % 8 != 0) && lq[0] == 1)
      fail("latent_shape_q " + shape_text(lq) +
           ": with h or w not a multiple of 8, rf_v2's reorder needs more than one frame (as MindIE's)");
    if (o.latent_shape_k && *o.latent_shape_k != lq)
      fail("latent_shape_k " + shape_text(*o.latent_shape_k) + " must equal latent_shape_q " + shape_text(lq) + " (self-attention)");
    o.latent_shape_k = lq;
    if (o.sparsity >= 1.0)
      fail("sparsity must be below 1 for rf_v2 (it keeps ceil(L * (1 - sparsity)) blocks per row), got " + number(o.sparsity));
  } else {
    const int64_t lk = ceil_div(s, attn::kSparseBlock);
    const attn::ada_bsa::Params p = attn::ada_bsa::make_params(1.0f, o.cdf_threshold, o.keep_sink, o.keep_recent, o.sparsity);
    if (lk >= 10 && attn::ada_bsa::capped_count(lk, p.row_sparse) < 1)
      fail("sparsity " + number(o.sparsity) + " keeps no block in rows of " + std::to_string(lk) +
           " blocks (ada_bsa keeps int(L * (1 - sparsity)), in float32)");
  }
  return o;
}

SparseMask estimate_sparse_mask(const Tensor& q, const Tensor& k, const SparseAttentionOptions& options, const Stream& stream) {
  const SparseAttentionOptions o = check_sparse_attention(q, k, k, options);
  SparseMask mask;
  mask.type = o.sparse_type;
  if (o.sparse_type == SparseType::none) return mask;
  const AttentionLayout layout = o.input_layout;
  const int64_t b = q.size(0), n = o.head_num, s = q.size(seq_dim(layout)), d = q.size(3);
  const float scale = scale_of(o, d);
  const auto stats = mask.stats;
  const int64_t lk = ceil_div(s, attn::kSparseBlock);
  const Tensor qc = q.stride(3) == 1 ? q : q.contiguous(), kc = k.stride(3) == 1 ? k : k.contiguous();
  if (o.sparse_type == SparseType::rf_v2) {
    const LatentShape latent = *o.latent_shape_q;
    const int64_t image = s - o.txt_len, l = attn::rf_v2::pooled_blocks(image, o.txt_len);
    // Every batch's own mask, as MindIE's get_blockwise_mask returns it; the kernel walks batch 0's
    // for every batch (MindIE passes mask[0] to rain_fusion_attention).
    mask.kept_blocks = stream.device().empty({b, n, l, l}, DType::u8, stream);
    mask.kernel_mask = mask.kept_blocks.narrow(0, 0, 1).narrow(2, 0, lk).narrow(3, 0, lk);
    mask.expected_density = attn::rf_v2::expected_density(latent, o.txt_len, o.sparsity);
    if (o.txt_len > 0 && image % attn::kSparseBlock != 0)
      mask.note = "rf_v2: the image part (" + std::to_string(image) +
                  " tokens) is not a multiple of 128, so the pooled text blocks do not "
                  "line up with the kernel's blocks; their indices are used as MindIE SD uses them";
    const auto order = std::make_shared<const std::vector<int32_t>>(attn::rf_v2::sequence_order(latent, o.txt_len));
    const Tensor out = mask.kept_blocks;
    const double flops = static_cast<double>(b * n) *
                         (4.0 * static_cast<double>(s * d) + 2.0 * static_cast<double>(l * l * d) + 4.0 * static_cast<double>(l * l));
    const double bytes = static_cast<double>(2 * b * n * s * d) * static_cast<double>(q.itemsize());
    stream.launch({"sparse_estimate_rf_v2", Unit::cube, flops, bytes, DType::f32}, {qc, kc}, {out},
                  [qc, kc, out, order, layout, b, n, d, image, l, lk, latent, o, scale, stats] {
                    std::atomic<int64_t> kept{0};
                    tbb::parallel_for(tbb::blocked_range<int64_t>(0, b * n, 1), [&](const tbb::blocked_range<int64_t>& r) {
                      std::vector<float> scores(static_cast<std::size_t>(l * l));
                      for (int64_t i = r.begin(); i < r.end(); ++i) {
                        const std::vector<float> qh = head_rows(qc, layout, i / n, i % n, order.get()),
                                                 kh = head_rows(kc, layout, i / n, i % n, order.get());
                        uint8_t* m = reinterpret_cast<uint8_t*>(out.unsynchronized_data_ptr()) + i * l * l;
                        attn::rf_v2::head_mask({qh.data(), kh.data(), d, image, o.txt_len, d, latent[1] * latent[2], scale, o.sparsity}, m,
                                               scores.data());
                        if (i >= n) continue;  // the statistics count what the kernel walks: batch 0's
                        int64_t count = 0;
                        for (int64_t row = 0; row < lk; ++row)
                          for (int64_t j = 0; j < lk; ++j) count += m[row * l + j];
                        kept += count;
                      }
                    });
                    stats->kept = kept.load();
                    stats->total = n * lk * lk;
                    stats->ready = true;
                  });
    return mask;
  }
  // ada_bsa: per batch and head.
  const attn::ada_bsa::Params params = attn::ada_bsa::make_params(scale, o.cdf_threshold, o.keep_sink, o.keep_recent, o.sparsity);
  if (lk < 10 && o.sparsity > 0.0)
    mask.note = "ada_bsa: rows of fewer than 10 key blocks (S <= 1152, here " + std::to_string(s) +
                ") keep every block, as MindIE SD's kernel; sparsity applies from S > 1152";
  mask.kept_blocks = stream.device().empty({b, n, lk, lk}, DType::u8, stream);
  mask.kernel_mask = mask.kept_blocks;
  mask.expected_density = attn::ada_bsa::expected_density(s, params);
  const Tensor out = mask.kept_blocks;
  const double groups = static_cast<double>(ceil_div(s, 8)) * static_cast<double>(s / 8);
  const double flops = static_cast<double>(b * n) * (2.0 * groups * 8.0 * static_cast<double>(d) + 5.0 * groups);
  const double bytes = static_cast<double>(2 * b * n * s * d) * static_cast<double>(q.itemsize());
  stream.launch({"sparse_estimate_ada_bsa", Unit::cube, flops, bytes, DType::f32}, {qc, kc}, {out},
                [qc, kc, out, layout, b, n, s, d, lk, params, stats] {
                  std::atomic<int64_t> kept{0};
                  tbb::parallel_for(tbb::blocked_range<int64_t>(0, b * n, 1), [&](const tbb::blocked_range<int64_t>& r) {
                    std::vector<float> scores(static_cast<std::size_t>(lk * lk));
                    for (int64_t i = r.begin(); i < r.end(); ++i) {
                      const std::vector<float> qh = head_rows(qc, layout, i / n, i % n, nullptr),
                                               kh = head_rows(kc, layout, i / n, i % n, nullptr);
                      attn::ada_bsa::block_scores(qh.data(), d, s, kh.data(), d, s, d, params.scale, scores.data());
                      uint8_t* m = reinterpret_cast<uint8_t*>(out.unsynchronized_data_ptr()) + i * lk * lk;
                      int64_t count = 0;
                      for (int64_t row = 0; row < lk; ++row) {
                        attn::ada_bsa::select_row(scores.data() + row * lk, lk, params, m + row * lk);
                        for (int64_t j = 0; j < lk; ++j) count += m[row * lk + j];
                      }
                      kept += count;
                    }
                  });
                  stats->kept = kept.load();
                  stats->total = b * n * lk * lk;
                  stats->ready = true;
                });
  return mask;
}

Tensor sparse_attention_with_mask(const Tensor& q, const Tensor& k, const Tensor& v, const SparseMask& mask,
                                  const SparseAttentionOptions& options, const Stream& stream) {
  const SparseAttentionOptions o = check_sparse_attention(q, k, v, options);
  if (mask.type != o.sparse_type)
    throw Error("sparse_attention: the mask was estimated for " + std::string(sparse_type_name(mask.type)) + ", not " +
                std::string(sparse_type_name(o.sparse_type)));
  if (o.sparse_type == SparseType::none) {
    AttentionOptions dense;
    dense.scale = o.scale;
    dense.layout = o.input_layout;
    return attention_forward(q, k, v, dense, stream);
  }
  const int64_t lk = ceil_div(q.size(seq_dim(o.input_layout)), attn::kSparseBlock);
  const Tensor& km = mask.kernel_mask;
  if (!km.defined() || km.dim() != 4 || (km.size(0) != 1 && km.size(0) != q.size(0)) || km.size(1) != o.head_num || km.size(2) != lk ||
      km.size(3) != lk)
    throw Error("sparse_attention: the mask " + km.brief() + " was estimated for other shapes than q " + q.brief());
  BlockSparseOptions bs;
  bs.scale = o.scale;
  bs.layout = o.input_layout;
  bs.density = mask.expected_density;
  if (o.sparse_type == SparseType::ada_bsa) return block_sparse_attention(q, k, v, km, bs, stream);
  const Reorder reorder = rf_v2_reorder(o);
  const Tensor qr = reorder_tokens(q, o.input_layout, reorder.forward, "sparse_reorder", stream);
  const Tensor kr = reorder_tokens(k, o.input_layout, reorder.forward, "sparse_reorder", stream);
  const Tensor vr = reorder_tokens(v, o.input_layout, reorder.forward, "sparse_reorder", stream);
  const Tensor out = block_sparse_attention(qr, kr, vr, km, bs, stream);
  return reorder_tokens(out, o.input_layout, reorder.inverse, "sparse_reorder_back", stream);
}

SparseAttentionResult sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v, const SparseAttentionOptions& options,
                                       const Stream& stream) {
  check_sparse_attention(q, k, v, options);
  const SparseMask mask = estimate_sparse_mask(q, k, options, stream);
  return {sparse_attention_with_mask(q, k, v, mask, options, stream), mask.kept_blocks, mask.note};
}

}  // namespace cubevec::ops
