// Row kernel of the activation quantization for the int8 GEMM (QuantizeArgs in ops/vector/kernels.h).
// Included only by ops/vector/isa_*.cpp (see load_store.h on linkage).
#pragma once

#include "ops/vector/impl/load_store.h"

namespace cubevec::ops::vk {
namespace {

constexpr int64_t kQuantizeBuffer = 16384;

template <class T>
void quantize_rows(const QuantizeArgs& a, int64_t r0, int64_t r1) {
  const int64_t n = a.width;
  const float* __restrict mul = a.mul_scale;
  float buffer[kQuantizeBuffer];
  for (int64_t r = r0; r < r1; ++r) {
    const T* __restrict x = static_cast<const T*>(a.x) + r * n;
    uint8_t* __restrict out = a.out + r * a.padded;
    // x' = x * mul_scale in an f32 buffer, chunk by chunk for rows wider than the buffer: the
    // absolute maximum (dynamic) and whether every value is finite.
    float scale = a.scale, offset = a.offset, amax = 0, bad = 0;
    for (int64_t c0 = 0; c0 < n; c0 += kQuantizeBuffer) {
      const int64_t m = n - c0 < kQuantizeBuffer ? n - c0 : kQuantizeBuffer;
      CUBEVEC_NO_ALIAS
      for (int64_t i = 0; i < m; ++i) buffer[i] = mul ? load(x, c0 + i) * mul[c0 + i] : load(x, c0 + i);
      // 16 lanes of GCC's vector extension: GCC left the per-lane arrays this replaces scalar
      // (-fopt-info: "unsupported use in stmt"). The order of a maximum does not change it; `bad`
      // only tells zero from NaN.
      typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));
      Lanes lane_max = {}, lane_bad = {};  // v - v: 0, or NaN for inf and NaN
      int64_t i = 0;
      for (; i + kLanes <= m; i += kLanes) {
        Lanes v;
        __builtin_memcpy(&v, buffer + i, sizeof v);
        const Lanes magnitude = v < 0 ? -v : v;
        lane_max = magnitude > lane_max ? magnitude : lane_max;
        lane_bad += v - v;
      }
      for (int64_t l = 0; l < kLanes; ++l) {
        amax = max_f(amax, lane_max[l]);
        bad += lane_bad[l];
      }
      for (; i < m; ++i) {
        amax = max_f(amax, abs_f(buffer[i]));
        bad += buffer[i] - buffer[i];
      }
    }
    const bool finite = bad == 0.0f;
    if (a.dynamic) {
      scale = !finite ? __builtin_nanf("") : amax == 0.0f ? 1.0f : amax / 127.0f;
      offset = 0;
      a.row_scale[r] = scale;
    } else {
      a.row_scale[r] = finite ? 1.0f : __builtin_nanf("");  // a non-finite row comes out NaN, not clamped
    }
    const float lo = a.dynamic ? -127.0f : -128.0f;
    for (int64_t c0 = 0; c0 < n; c0 += kQuantizeBuffer) {
      const int64_t m = n - c0 < kQuantizeBuffer ? n - c0 : kQuantizeBuffer;
      CUBEVEC_NO_ALIAS
      for (int64_t i = 0; i < m; ++i) {
        const float v = mul ? load(x, c0 + i) * mul[c0 + i] : load(x, c0 + i);
        float q = __builtin_rintf(v / scale + offset);
        q = q != q ? 0.0f : min_f(max_f(q, lo), 127.0f);  // a NaN (non-finite row) quantizes to 0
        out[c0 + i] = static_cast<uint8_t>(static_cast<int32_t>(q) + 128);
      }
    }
    for (int64_t i = n; i < a.padded; ++i) out[i] = 128;
  }
}

}  // namespace
}  // namespace cubevec::ops::vk
