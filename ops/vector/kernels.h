// The vector kernels' inner loops, behind a table of plain functions with one copy per ISA
// (ops/vector/isa_*.cpp compile the same loops in ops/vector/impl/ for AVX-512, AVX2 and the
// x86-64 baseline). The op files validate, allocate, launch and split rows over threads; a table
// function does the arithmetic for a range of rows (or elements) on raw pointers.
//
// This header is included by files compiled for different ISAs: it declares only plain data and
// function pointers, nothing with inline code.
#pragma once

#include <cstdint>
#include <string_view>

#include "ops/isa.h"

namespace cubevec::ops::vk {

// How a float operand is stored: f32, or bf16 (its upper 16 bits, read exactly, written with
// round-to-nearest-even). Arithmetic is always f32.
enum class Elem : uint8_t { f32, bf16 };

// rms_norm, fast_layernorm, layernorm_scale_shift and softmax: rows of `width` contiguous values;
// out has x's storage type.
struct RowArgs {
  const void* x = nullptr;
  void* out = nullptr;
  Elem type = Elem::f32;
  int64_t width = 0;
  float eps = 0;
  const float* weight = nullptr;  // [width] or null (ones)
  const float* bias = nullptr;    // [width] or null (zeros)
  float* mean = nullptr;          // per row, or null (layer norm only)
  float* rstd = nullptr;          // per row, or null (layer norm only)
  // AdaLN (layer norm only): out = LN(x) * (1 + scale) + shift, the parameter row of row r being
  // r / param_div; null for a plain layer norm.
  const void* scale = nullptr;
  const void* shift = nullptr;
  Elem param_type = Elem::f32;
  int64_t param_div = 1;
};

// group_norm over contiguous x [N, C, HW]: group i of the N * G groups spans
// channels_per_group * hw contiguous values.
struct GroupNormArgs {
  const void* x = nullptr;
  void* out = nullptr;
  Elem type = Elem::f32;
  int64_t groups = 1;  // G
  int64_t channels_per_group = 1;
  int64_t hw = 1;
  float eps = 0;
  const float* weight = nullptr;  // [C] or null
  const float* bias = nullptr;    // [C] or null
  bool silu = false;              // SiLU on the normalized value before the store
};

// normalize_channels over contiguous x [N, C, S]: item i of the N * ceil(S / block) items is the
// column block [b * block, min(S, (b + 1) * block)) of sample n (i = n * blocks + b); every column
// (one position s) is scaled by scale / max(||x[n, :, s]||_2, eps), then each channel by weight[c].
struct ChannelNormArgs {
  const void* x = nullptr;
  void* out = nullptr;
  Elem type = Elem::f32;
  int64_t channels = 1;  // C
  int64_t inner = 1;     // S
  int64_t block = 1;     // columns per item, at most kChannelNormBlock
  float eps = 0;
  float scale = 1;
  const float* weight = nullptr;  // [C] or null (ones)
  bool silu = false;              // SiLU on the normalized value before the store
};
inline constexpr int64_t kChannelNormBlock = 256;

// RoPE on contiguous rows of `d` values; row r uses cos/sin row (r / s_div) % s_mod.
struct RopeArgs {
  const void* x = nullptr;
  void* out = nullptr;
  Elem type = Elem::f32;
  const void* cos = nullptr;  // [S, d], contiguous
  const void* sin = nullptr;
  Elem cs_type = Elem::f32;
  int64_t d = 0;
  int64_t s_div = 1, s_mod = 1;
  bool interleaved = false;
};

enum class ActKind : uint8_t { relu, silu, mish, gelu, gelu_tanh, gelu_fast };

// Unary elementwise on contiguous elements [i0, i1).
struct UnaryArgs {
  const void* x = nullptr;
  void* out = nullptr;
  Elem type = Elem::f32;
  ActKind kind = ActKind::relu;
};

enum class BinaryOp : uint8_t { add, sub, mul, div, muls_add };  // muls_add: a * scale + b

inline constexpr int kMaxDims = 16;

// out (contiguous, rows of `inner`) = a op b, a and b read through element strides that broadcast
// (stride 0). Row r of out has the multi-index of r over outer_shape[0..rank).
struct BinaryArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
  Elem type = Elem::f32;
  BinaryOp op = BinaryOp::add;
  float scale = 1;
  int rank = 0;
  int64_t outer_shape[kMaxDims] = {};
  int64_t a_stride[kMaxDims] = {};
  int64_t b_stride[kMaxDims] = {};
  int64_t inner = 1;
  int64_t a_inner_stride = 1, b_inner_stride = 1;
};

// Contiguous elements [i0, i1) of src converted into dst.
struct ConvertArgs {
  const void* src = nullptr;
  void* dst = nullptr;
  Elem from = Elem::f32, to = Elem::f32;
};

// Activation quantization of contiguous rows of `width` values (f32 or bf16) into rows of `padded`
// bytes of the int8 GEMM's A operand: q as s8 + 128, the padding the s8 zero (128).
//   x' = x * mul_scale (when given, SmoothQuant);
//   dynamic: s = max|x'| / 127 (1 for an all-zero row, NaN for a non-finite one), q = rint(x' / s),
//            row_scale[r] = s;
//   static:  q = clamp(rint(x' / scale + offset), -128, 127), row_scale[r] = 1;
// a row with a non-finite value gets row_scale NaN (its products come out NaN, never clamped to a
// finite value). rint rounds half to even, as torch.round and the NPU's quantize.
struct QuantizeArgs {
  const void* x = nullptr;
  Elem type = Elem::f32;
  int64_t width = 0, padded = 0;
  uint8_t* out = nullptr;
  const float* mul_scale = nullptr;
  bool dynamic = true;
  float scale = 1, offset = 0;
  float* row_scale = nullptr;  // [rows]
};

struct Kernels {
  void (*rms_norm)(const RowArgs&, int64_t r0, int64_t r1);
  void (*layer_norm)(const RowArgs&, int64_t r0, int64_t r1);
  void (*softmax)(const RowArgs&, int64_t r0, int64_t r1);
  void (*group_norm)(const GroupNormArgs&, int64_t g0, int64_t g1);  // over N * G groups
  void (*rope)(const RopeArgs&, int64_t r0, int64_t r1);
  void (*unary)(const UnaryArgs&, int64_t i0, int64_t i1);
  void (*binary)(const BinaryArgs&, int64_t r0, int64_t r1);
  void (*convert)(const ConvertArgs&, int64_t i0, int64_t i1);
  void (*channel_norm)(const ChannelNormArgs&, int64_t i0, int64_t i1);  // over the column-block items
  void (*quantize)(const QuantizeArgs&, int64_t r0, int64_t r1);
};

using ops::Isa;
using ops::isa_name;
using ops::isa_supported;

const Kernels& kernels_avx512();
const Kernels& kernels_avx2();
const Kernels& kernels_portable();

// The widest ISA this CPU runs; CUBEVEC_VECTOR_ISA=avx512|avx2|portable picks another (read on
// every call, so tests can exercise each path).
Isa best_isa();
const Kernels& kernels(Isa isa);
const Kernels& kernels();  // kernels(best_isa())

}  // namespace cubevec::ops::vk
