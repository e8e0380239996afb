// P (32 rows of 128 f32 probabilities) to bf16, nearest even, the columns from `keys` on zero: what
// both bf16 P V products (AMX tiles, AVX512-BF16 dot products) multiply. Included only by files
// compiled with -mavx512bf16; `static` keeps each copy private to its file.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "ops/attention/flash_amx_kernels.h"
#include "ops/attention/tile_kernels.h"

namespace cubevec::ops::attn {

// Returns the number of 32-key chunks that hold any key (the rest of `pb` is left unwritten).
static inline int round_p_to_bf16(const float* p, int keys, uint16_t* pb) {
  const int chunks = (keys + 31) / 32;
  for (int c = 0; c < chunks * 32; c += 32) {
    const int valid = keys - c;
    const __mmask16 lo = static_cast<__mmask16>(valid >= 16 ? 0xFFFF : valid > 0 ? (1u << valid) - 1u : 0u);
    const __mmask16 hi = static_cast<__mmask16>(valid >= 32 ? 0xFFFF : valid > 16 ? (1u << (valid - 16)) - 1u : 0u);
    for (int r = 0; r < kAmxRows; ++r) {
      const __m512 a = _mm512_maskz_loadu_ps(lo, p + r * kBlockKeys + c), b = _mm512_maskz_loadu_ps(hi, p + r * kBlockKeys + c + 16);
      _mm512_storeu_si512(pb + r * kBlockKeys + c, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
    }
  }
  return chunks;
}

}  // namespace cubevec::ops::attn
