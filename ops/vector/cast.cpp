// cast (f32 / bf16 / f16) and contiguous copies, on the Vector unit.
#include <algorithm>
#include <cstring>

#include "ops/vector/common.h"
#include "tensor/half.h"

namespace cubevec::ops {

namespace {

// Copies src (any strides) into the contiguous dst, row by row of the collapsed layout.
void strided_copy(const std::byte* src, std::byte* dst, const detail::CollapsedLayout& layout, std::size_t item) {
  const Shape& shape = layout.shape;
  const Strides& strides = layout.strides[0];
  const auto rank = static_cast<int64_t>(shape.size());
  const int64_t inner = shape.back(), inner_stride = strides.back();
  const int64_t rows = shape_numel(shape) / inner;
  const auto isize = static_cast<int64_t>(item);
  if (rank >= 2 && inner_stride != 1 && strides[rank - 2] == 1 && (item == 1 || item == 2 || item == 4 || item == 8)) {
    // A batch of transposes (the second-to-last dim is the source's contiguous one): copied in
    // square tiles so both the reads and the writes stay within a few cache lines.
    constexpr int64_t kTile = 64;
    const int64_t a_size = shape[rank - 2], b_size = inner;
    const int64_t a_tiles = (a_size + kTile - 1) / kTile, b_tiles = (b_size + kTile - 1) / kTile;
    const int64_t outer = shape_numel(shape) / (a_size * b_size);
    const auto copy = [&](auto word) {
      using Word = decltype(word);
      detail::parallel_chunks(outer * a_tiles * b_tiles, kTile * kTile, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t bt = t % b_tiles, at = (t / b_tiles) % a_tiles, o = t / (b_tiles * a_tiles);
          int64_t offset = 0;
          for (int64_t d = rank - 3, rest = o; d >= 0; --d) {
            offset += (rest % shape[d]) * strides[d];
            rest /= shape[d];
          }
          const Word* s = reinterpret_cast<const Word*>(src) + offset;
          Word* o_ptr = reinterpret_cast<Word*>(dst) + o * a_size * b_size;
          const int64_t a0 = at * kTile, a1 = std::min(a_size, a0 + kTile);
          const int64_t b0 = bt * kTile, b1 = std::min(b_size, b0 + kTile);
          for (int64_t a = a0; a < a1; ++a) {
            Word* __restrict oa = o_ptr + a * b_size;
            const Word* __restrict sa = s + a;
            for (int64_t b = b0; b < b1; ++b) oa[b] = sa[b * inner_stride];
          }
        }
      });
    };
    if (item == 1) copy(uint8_t{});
    else if (item == 2) copy(uint16_t{});
    else if (item == 4) copy(uint32_t{});
    else copy(uint64_t{});
    return;
  }
  detail::parallel_chunks(rows, inner, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t offset = 0;
      for (int64_t d = rank - 2, rest = r; d >= 0; --d) {
        offset += (rest % shape[d]) * strides[d];
        rest /= shape[d];
      }
      const std::byte* s = src + offset * isize;
      std::byte* o = dst + r * inner * isize;
      if (inner_stride == 1) {
        std::memcpy(o, s, static_cast<std::size_t>(inner) * item);
        continue;
      }
      const auto copy = [&](auto word) {
        using Word = decltype(word);
        for (int64_t i = 0; i < inner; ++i) {
          Word w;
          std::memcpy(&w, s + i * inner_stride * isize, sizeof w);
          std::memcpy(o + i * isize, &w, sizeof w);
        }
      };
      if (item == 1) copy(uint8_t{});
      else if (item == 2) copy(uint16_t{});
      else if (item == 4) copy(uint32_t{});
      else copy(uint64_t{});
    }
  });
}

bool castable(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

// Converts n contiguous elements; f16 goes through f32 (exact) in stack-sized pieces.
void convert(const vk::Kernels& k, const void* src, DType from, void* dst, DType to, int64_t i0, int64_t i1) {
  if (from != DType::f16 && to != DType::f16) {
    k.convert({src, dst, detail::elem_of(from), detail::elem_of(to)}, i0, i1);
    return;
  }
  const auto* s16 = static_cast<const uint16_t*>(src);
  auto* d16 = static_cast<uint16_t*>(dst);
  if (from == DType::f16 && to == DType::f32) {
    convert_f16_to_f32(s16 + i0, static_cast<float*>(dst) + i0, static_cast<std::size_t>(i1 - i0));
    return;
  }
  if (from == DType::f32 && to == DType::f16) {
    convert_f32_to_f16(static_cast<const float*>(src) + i0, d16 + i0, static_cast<std::size_t>(i1 - i0));
    return;
  }
  constexpr int64_t kPiece = 1024;  // bf16 <-> f16
  float buffer[kPiece];
  for (int64_t i = i0; i < i1; i += kPiece) {
    const int64_t n = std::min(kPiece, i1 - i);
    if (from == DType::f16) {
      convert_f16_to_f32(s16 + i, buffer, static_cast<std::size_t>(n));
      k.convert({buffer, d16 + i, vk::Elem::f32, vk::Elem::bf16}, 0, n);
    } else {
      k.convert({s16 + i, buffer, vk::Elem::bf16, vk::Elem::f32}, 0, n);
      convert_f32_to_f16(buffer, d16 + i, static_cast<std::size_t>(n));
    }
  }
}

}  // namespace

Tensor contiguous(const Tensor& x, const Stream& stream) {
  if (!x.defined()) throw Error("contiguous: x is undefined");
  if (x.is_contiguous()) return x;
  Tensor out = stream.device().empty(x.shape(), x.dtype(), stream);
  const double bytes = 2.0 * static_cast<double>(x.nbytes());
  stream.launch({"contiguous", Unit::vector, 0.0, bytes, DType::f32}, {x}, {out}, [x, out] {
    if (x.numel() == 0) return;
    const detail::CollapsedLayout layout = detail::collapse(x.shape(), {x.strides()});
    strided_copy(x.unsynchronized_data_ptr(), out.unsynchronized_data_ptr(), layout, x.itemsize());
  });
  return out;
}

Tensor cast(const Tensor& x, DType to, const Stream& stream) {
  if (!x.defined()) throw Error("cast: x is undefined");
  if (!castable(x.dtype()) || !castable(to))
    throw Error("cast: converts between f32, bf16 and f16, got " + x.brief() + " to " + std::string(dtype_name(to)));
  if (to == x.dtype()) return contiguous(x, stream);
  const Tensor xc = contiguous(x, stream);
  Tensor out = stream.device().empty(x.shape(), to, stream);
  const auto n = static_cast<double>(x.numel());
  const double bytes = n * static_cast<double>(x.itemsize() + dtype_size(to));
  const vk::Kernels* k = &vk::kernels();
  const DType from = x.dtype();
  stream.launch({"cast_" + std::string(dtype_name(from)) + "_" + std::string(dtype_name(to)), Unit::vector, 0.0, bytes, DType::f32}, {xc},
                {out}, [xc, out, from, to, k] {
                  const void* src = xc.unsynchronized_data_ptr();
                  void* dst = out.unsynchronized_data_ptr();
                  detail::parallel_chunks(xc.numel(), 1, [&](int64_t i0, int64_t i1) { convert(*k, src, from, dst, to, i0, i1); });
                });
  return out;
}

}  // namespace cubevec::ops
