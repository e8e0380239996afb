// Broadcasting binary arithmetic and dtype conversion (f32 <-> bf16).
// Included only by ops/vector/isa_*.cpp (see load_store.h on linkage).
#pragma once

#include "ops/vector/impl/load_store.h"

namespace cubevec::ops::vk {
namespace {

template <BinaryOp Op>
inline float apply(float x, float y, float scale) {
  if constexpr (Op == BinaryOp::add) return x + y;
  else if constexpr (Op == BinaryOp::sub) return x - y;
  else if constexpr (Op == BinaryOp::mul) return x * y;
  else if constexpr (Op == BinaryOp::div) return x / y;
  else return x * scale + y;
}

// One output row of `n` values; the common stride patterns get their own loop so they vectorize.
template <class T, BinaryOp Op>
inline void binary_row(const T* __restrict a, int64_t sa, const T* __restrict b, int64_t sb, T* __restrict out, int64_t n, float scale) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) store(out, i, apply<Op>(load(a, i), load(b, i), scale));
  } else if (sa == 1 && sb == 0) {
    const float y = load(b, 0);
    for (int64_t i = 0; i < n; ++i) store(out, i, apply<Op>(load(a, i), y, scale));
  } else if (sa == 0 && sb == 1) {
    const float x = load(a, 0);
    for (int64_t i = 0; i < n; ++i) store(out, i, apply<Op>(x, load(b, i), scale));
  } else {
    for (int64_t i = 0; i < n; ++i) store(out, i, apply<Op>(load(a, i * sa), load(b, i * sb), scale));
  }
}

template <class T, BinaryOp Op>
void binary_rows_impl(const BinaryArgs& p, int64_t r0, int64_t r1) {
  int64_t index[kMaxDims] = {};
  int64_t oa = 0, ob = 0;
  for (int64_t d = p.rank - 1, rest = r0; d >= 0; --d) {
    index[d] = rest % p.outer_shape[d];
    rest /= p.outer_shape[d];
    oa += index[d] * p.a_stride[d];
    ob += index[d] * p.b_stride[d];
  }
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  T* out = static_cast<T*>(p.out);
  for (int64_t r = r0; r < r1; ++r) {
    binary_row<T, Op>(a + oa, p.a_inner_stride, b + ob, p.b_inner_stride, out + r * p.inner, p.inner, p.scale);
    for (int64_t d = p.rank - 1; d >= 0; --d) {  // next row's multi-index and offsets
      oa += p.a_stride[d];
      ob += p.b_stride[d];
      if (++index[d] < p.outer_shape[d]) break;
      oa -= p.a_stride[d] * p.outer_shape[d];
      ob -= p.b_stride[d] * p.outer_shape[d];
      index[d] = 0;
    }
  }
}

template <class T>
void binary_rows(const BinaryArgs& p, int64_t r0, int64_t r1) {
  switch (p.op) {
    case BinaryOp::add: return binary_rows_impl<T, BinaryOp::add>(p, r0, r1);
    case BinaryOp::sub: return binary_rows_impl<T, BinaryOp::sub>(p, r0, r1);
    case BinaryOp::mul: return binary_rows_impl<T, BinaryOp::mul>(p, r0, r1);
    case BinaryOp::div: return binary_rows_impl<T, BinaryOp::div>(p, r0, r1);
    case BinaryOp::muls_add: return binary_rows_impl<T, BinaryOp::muls_add>(p, r0, r1);
  }
}

template <class From, class To>
void convert_range(const ConvertArgs& a, int64_t i0, int64_t i1) {
  const From* __restrict src = static_cast<const From*>(a.src);
  To* __restrict dst = static_cast<To*>(a.dst);
  for (int64_t i = i0; i < i1; ++i) store(dst, i, load(src, i));
}

}  // namespace
}  // namespace cubevec::ops::vk
