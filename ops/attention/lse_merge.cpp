// merge_attention_partials: two softmax results over disjoint key sets combined by their
// log-sum-exps (ring attention's merge, docs/parallel.md, "Ring attention's log-sum-exp merge"), in
// f32 on the Vector unit; the out rows are read and written in the partials' dtype.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/attention.h"
#include "ops/vector/common.h"
#include "base/error.h"

namespace cubevec::ops {

AttentionPartial merge_attention_partials(const AttentionPartial& a, const AttentionPartial& b, AttentionLayout layout,
                                          const Stream& stream) {
  const char* op = "merge_attention_partials";
  auto fail = [&](const std::string& what) { throw Error(std::string(op) + ": " + what); };
  if (layout == AttentionLayout::bsh) fail("layout must be BSND or BNSD, got BSH");
  for (const AttentionPartial* p : {&a, &b}) {
    if (!p->out.defined() || p->out.dim() != 4 || (p->out.dtype() != DType::f32 && p->out.dtype() != DType::bf16))
      fail("out must be f32 or bf16 4-D, got " + p->out.brief());
    if (!p->lse.defined() || p->lse.dtype() != DType::f32 || p->lse.dim() != 3) fail("lse must be f32 [B, N, Sq], got " + p->lse.brief());
  }
  if (a.out.shape() != b.out.shape() || a.out.dtype() != b.out.dtype())
    fail("the two outs must have one shape and dtype, got " + a.out.brief() + " and " + b.out.brief());
  const bool bnsd = layout == AttentionLayout::bnsd;
  const int64_t batch = a.out.size(0), heads = a.out.size(bnsd ? 1 : 2), sq = a.out.size(bnsd ? 2 : 1), d = a.out.size(3);
  const Shape lse_shape{batch, heads, sq};
  if (a.lse.shape() != lse_shape || b.lse.shape() != lse_shape)
    fail("lse must be [B, N, Sq] = " + shape_to_string(lse_shape) + " for out " + a.out.brief() + " in layout " +
         std::string(attention_layout_name(layout)) + ", got " + a.lse.brief() + " and " + b.lse.brief());
  const Tensor oa = detail::contiguous_on(a.out, stream), ob = detail::contiguous_on(b.out, stream);
  const Tensor la = detail::contiguous_on(a.lse, stream), lb = detail::contiguous_on(b.lse, stream);
  const DType dtype = oa.dtype();
  Tensor out = stream.device().empty(oa.shape(), dtype, stream);
  Tensor lse = stream.device().empty(lse_shape, DType::f32, stream);
  const double rows = static_cast<double>(batch * heads * sq);
  stream.launch({"attention_lse_merge", Unit::vector, rows * (3.0 * static_cast<double>(d) + 8.0),
                 3.0 * static_cast<double>(oa.nbytes()) + 3.0 * 4.0 * rows, DType::f32},
                {oa, ob, la, lb}, {out, lse}, [=] {
                  const float* lse_a = detail::f32_ptr(la);
                  const float* lse_b = detail::f32_ptr(lb);
                  float* lse_out = static_cast<float*>(detail::out_ptr(lse));
                  const void* pa = detail::in_ptr(oa);
                  const void* pb = detail::in_ptr(ob);
                  void* po = detail::out_ptr(out);
                  const float neg_inf = -std::numeric_limits<float>::infinity();
                  // Row r = (b, n, s) of lse; its out row starts at element `first` of the layout.
                  detail::parallel_chunks(batch * heads * sq, d, [&](int64_t begin, int64_t end) {
                    for (int64_t r = begin; r < end; ++r) {
                      const int64_t s = r % sq, n = (r / sq) % heads, bi = r / (sq * heads);
                      const int64_t first = (bnsd ? ((bi * heads + n) * sq + s) : ((bi * sq + s) * heads + n)) * d;
                      const float x = lse_a[r], y = lse_b[r];
                      const float m = std::max(x, y);
                      if (m == neg_inf) {
                        lse_out[r] = neg_inf;
                        for (int64_t c = 0; c < d; ++c) detail::store_float(po, dtype, first + c, std::numeric_limits<float>::quiet_NaN());
                        continue;
                      }
                      const float ea = x == neg_inf ? 0.0f : std::exp(x - m), eb = y == neg_inf ? 0.0f : std::exp(y - m);
                      const float total = ea + eb;
                      lse_out[r] = m + std::log(total);
                      const float wa = ea / total, wb = eb / total;
                      for (int64_t c = 0; c < d; ++c) {
                        const float va = wa == 0.0f ? 0.0f : wa * detail::load_float(pa, dtype, first + c);
                        const float vb = wb == 0.0f ? 0.0f : wb * detail::load_float(pb, dtype, first + c);
                        detail::store_float(po, dtype, first + c, va + vb);
                      }
                    }
                  });
                });
  return {out, lse};
}

}  // namespace cubevec::ops
