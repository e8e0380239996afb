// Copies between tensors of any strides: contiguous(), clone(), copy_from().
#include <cstring>

#include "tensor/tensor.h"

namespace cubevec {

namespace {

template <class Word>
void copy_row(std::byte* dst, int64_t dst_stride, const std::byte* src, int64_t src_stride, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    Word w;
    std::memcpy(&w, src + i * src_stride, sizeof(Word));
    std::memcpy(dst + i * dst_stride, &w, sizeof(Word));
  }
}

// Copies every element of `src` into `dst` (same shape), row by row along the last dimension.
void strided_copy(const Tensor& src, std::byte* dst_base, const Strides& dst_strides) {
  const std::size_t item = src.itemsize();
  const auto* src_base = static_cast<const std::byte*>(src.data_ptr());
  const int64_t rank = src.dim();
  if (src.numel() == 0) return;
  if (rank == 0) {
    std::memcpy(dst_base, src_base, item);
    return;
  }
  const int64_t n = src.shape().back();
  const auto isize = static_cast<int64_t>(item);
  const int64_t src_step = src.strides().back() * isize;
  const int64_t dst_step = dst_strides.back() * isize;
  std::vector<int64_t> index(rank - 1, 0);
  while (true) {
    int64_t src_off = 0, dst_off = 0;
    for (int64_t d = 0; d < rank - 1; ++d) {
      src_off += index[d] * src.strides()[d] * isize;
      dst_off += index[d] * dst_strides[d] * isize;
    }
    std::byte* dst = dst_base + dst_off;
    const std::byte* s = src_base + src_off;
    if (src_step == isize && dst_step == isize) std::memcpy(dst, s, static_cast<std::size_t>(n) * item);
    else if (item == 1) copy_row<uint8_t>(dst, dst_step, s, src_step, n);
    else if (item == 2) copy_row<uint16_t>(dst, dst_step, s, src_step, n);
    else if (item == 4) copy_row<uint32_t>(dst, dst_step, s, src_step, n);
    else copy_row<uint64_t>(dst, dst_step, s, src_step, n);
    int64_t d = rank - 2;  // advance the multi-index over all but the last dim
    for (; d >= 0; --d) {
      if (++index[d] < src.shape()[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  if (!has_storage()) return meta(shape_, dtype_);
  Tensor out = empty(shape_, dtype_);
  strided_copy(*this, static_cast<std::byte*>(out.mutable_data_ptr()), out.strides());
  return out;
}

void Tensor::copy_from(const Tensor& source) {
  if (source.shape() != shape_ || source.dtype() != dtype_)
    throw Error("copy_from: source " + source.describe() + " does not match destination " + describe() +
                " (expected the same shape and dtype)");
  for (std::size_t i = 0; i < shape_.size(); ++i)
    if (strides_[i] == 0 && shape_[i] > 1)
      throw Error("copy_from: destination " + describe() + " is expanded (several elements share one address)");
  // A source that shares our storage may overlap what we write: read it from a private copy.
  const Tensor from = source.shares_storage_with(*this) ? source.clone() : source;
  strided_copy(from, static_cast<std::byte*>(mutable_data_ptr()), strides_);
}

}  // namespace cubevec
