#include "tensor/shape.h"

#include "base/error.h"

namespace cubevec {

std::string shape_to_string(std::span<const int64_t> shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

int64_t shape_numel(std::span<const int64_t> shape) {
  int64_t numel = 1;
  for (int64_t size : shape) {
    if (size < 0) throw Error("invalid shape " + shape_to_string(shape) + ": sizes must be non-negative");
    if (__builtin_mul_overflow(numel, size, &numel))
      throw Error("invalid shape " + shape_to_string(shape) + ": the element count overflows int64");
  }
  return numel;
}

Strides contiguous_strides(std::span<const int64_t> shape) {
  Strides strides(shape.size());
  int64_t stride = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i] > 1 ? shape[i] : 1;
  }
  return strides;
}

int64_t wrap_dim(int64_t dim, int64_t rank, const char* what) {
  const int64_t wrapped = dim < 0 ? dim + rank : dim;
  if (wrapped < 0 || wrapped >= rank)
    throw Error(std::string(what) + ": dimension " + std::to_string(dim) + " is out of range for a tensor of rank " + std::to_string(rank) +
                " (expected " + std::to_string(-rank) + " .. " + std::to_string(rank - 1) + ")");
  return wrapped;
}

Shape infer_shape(std::span<const int64_t> shape, int64_t numel, std::span<const int64_t> from_shape) {
  Shape result(shape.begin(), shape.end());
  int64_t known = 1;
  int64_t infer_at = -1;
  for (std::size_t i = 0; i < result.size(); ++i) {
    if (result[i] == -1) {
      if (infer_at >= 0) throw Error("shape " + shape_to_string(shape) + " has more than one -1");
      infer_at = static_cast<int64_t>(i);
    } else if (result[i] < 0) {
      throw Error("shape " + shape_to_string(shape) + " has a negative size other than -1");
    } else if (__builtin_mul_overflow(known, result[i], &known)) {
      throw Error("shape " + shape_to_string(shape) + ": the element count overflows int64");
    }
  }
  const std::string mismatch = "cannot view a tensor of shape " + shape_to_string(from_shape) + " (" + std::to_string(numel) +
                               " elements) as shape " + shape_to_string(shape);
  if (infer_at >= 0) {
    if (known == 0) throw Error(mismatch + ": the size of -1 is ambiguous next to a zero size");
    if (numel % known != 0) throw Error(mismatch + ": " + std::to_string(numel) + " is not divisible by " + std::to_string(known));
    result[infer_at] = numel / known;
  } else if (known != numel) {
    throw Error(mismatch + " (" + std::to_string(known) + " elements)");
  }
  return result;
}

}  // namespace cubevec
