// Row kernel of RoPE: out = x * cos + rot(x) * sin, rot by halves or by interleaved pairs.
// Included only by ops/vector/isa_*.cpp (see load_store.h on linkage).
#pragma once

#include "ops/vector/impl/load_store.h"

namespace cubevec::ops::vk {
namespace {

template <class T, class C, bool kInterleaved>
void rope_rows_impl(const RopeArgs& a, int64_t r0, int64_t r1) {
  const int64_t d = a.d, half = d / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t s = (r / a.s_div) % a.s_mod;
    const C* __restrict c = static_cast<const C*>(a.cos) + s * d;
    const C* __restrict sn = static_cast<const C*>(a.sin) + s * d;
    const T* __restrict x = static_cast<const T*>(a.x) + r * d;
    T* __restrict out = static_cast<T*>(a.out) + r * d;
    if constexpr (kInterleaved) {
      for (int64_t i = 0; i < d; i += 2) {
        const float x0 = load(x, i), x1 = load(x, i + 1);
        store(out, i, x0 * load(c, i) - x1 * load(sn, i));
        store(out, i + 1, x1 * load(c, i + 1) + x0 * load(sn, i + 1));
      }
    } else {
      // One store stream per loop (two interleaved ones keep GCC from vectorizing bf16 rows).
      const T* __restrict x2 = x + half;
      const C* __restrict c2 = c + half;
      const C* __restrict sn2 = sn + half;
      T* __restrict out2 = out + half;
      for (int64_t i = 0; i < half; ++i) store(out, i, load(x, i) * load(c, i) - load(x2, i) * load(sn, i));
      for (int64_t i = 0; i < half; ++i) store(out2, i, load(x2, i) * load(c2, i) + load(x, i) * load(sn2, i));
    }
  }
}

template <class T, class C>
void rope_rows(const RopeArgs& a, int64_t r0, int64_t r1) {
  if (a.interleaved) rope_rows_impl<T, C, true>(a, r0, r1);
  else rope_rows_impl<T, C, false>(a, r0, r1);
}

template <class T>
void rope_rows(const RopeArgs& a, int64_t r0, int64_t r1) {
  if (a.cs_type == Elem::f32) rope_rows<T, float>(a, r0, r1);
  else rope_rows<T, bf16_t>(a, r0, r1);
}

}  // namespace
}  // namespace cubevec::ops::vk
