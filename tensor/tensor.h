// Tensor: a typed, strided view (shape, strides in elements, offset) of a shared Storage.
// View operations (view, reshape, permute, transpose, narrow, slice, select, expand, unsqueeze,
// squeeze) share the storage and never copy; contiguous() copies only when the layout needs it.
// A tensor without storage ("meta", for simulate mode) has shape and dtype only.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <type_traits>
#include <string>
#include <vector>

#include "tensor/caching_allocator.h"
#include "tensor/dtype.h"
#include "base/error.h"
#include "tensor/shape.h"
#include "tensor/storage.h"

namespace cubevec {

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  static Tensor empty(Shape shape, DType dtype, Allocator& allocator = default_allocator(), StreamTag stream = kHostStream);
  static Tensor zeros(Shape shape, DType dtype, Allocator& allocator = default_allocator());
  // Shape and dtype without storage: ops compute shapes and costs, no data (simulate mode).
  static Tensor meta(Shape shape, DType dtype);
  // A view of existing storage; throws if the view reaches outside the storage.
  static Tensor from_storage(std::shared_ptr<Storage> storage, Shape shape, Strides strides, int64_t offset, DType dtype);
  // A new contiguous tensor holding a copy of `values`.
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape);

  bool defined() const { return defined_; }
  // False for meta tensors: they have a (byte-less) storage for dependency tracking, but no data.
  bool has_storage() const { return storage_ && !storage_->is_meta(); }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t numel() const;
  std::size_t itemsize() const { return dtype_size(dtype_); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * itemsize(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool shares_storage_with(const Tensor& other) const { return has_storage() && storage_ == other.storage_; }
  // "Tensor(f32, shape [2, 3], strides [3, 1], offset 0)"
  std::string describe() const;
  // "f32 [2, 3]", or "nothing" for an undefined tensor: the short form error messages use.
  std::string brief() const;

  // Address of the element at index 0 (offset applied), after the device work that writes the
  // tensor (and, for mutable access, reads it) has finished. Throws on a meta tensor.
  const void* data_ptr() const;
  void* mutable_data_ptr();
  // For kernels the device has ordered after the tensor's pending work: no host waiting.
  std::byte* unsynchronized_data_ptr() const;
  // Typed access; T must match the dtype (uint16_t for f16 and bf16).
  template <class T>
  const T* data() const;
  template <class T>
  T* mutable_data();
  // One element, bounds-checked (for tests and debugging, not for kernels).
  template <class T>
  T at(const std::vector<int64_t>& index) const;

  Tensor view(const Shape& shape) const;     // throws if the strides cannot express it
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a contiguous copy
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes `dim`
  Tensor expand(const Shape& shape) const;          // -1 keeps a size; size-1 dims broadcast
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;

  Tensor contiguous() const;             // *this when already contiguous
  Tensor clone() const;                  // always a new contiguous copy
  void copy_from(const Tensor& source);  // same shape and dtype, any strides

 private:
  Tensor(std::shared_ptr<Storage> storage, Shape shape, Strides strides, int64_t offset, DType dtype);
  Tensor with_layout(Shape shape, Strides strides, int64_t offset) const;
  [[noreturn]] void throw_type_mismatch(std::string_view requested) const;
  std::size_t element_byte_offset(const std::vector<int64_t>& index) const;

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Strides strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::f32;
  bool defined_ = false;
};

// The DType a C++ element type may be read as: uint16_t serves both f16 and bf16.
template <class T>
constexpr bool element_type_matches(DType dtype) {
  if constexpr (std::is_same_v<T, uint16_t>) return dtype == DType::f16 || dtype == DType::bf16;
  else return dtype == dtype_of<T>();
}

template <class T>
std::string_view element_type_name() {
  if constexpr (std::is_same_v<T, uint16_t>) return "f16/bf16 (uint16_t)";
  else return dtype_name(dtype_of<T>());
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, Shape shape) {
  if (shape_numel(shape) != static_cast<int64_t>(values.size()))
    throw Error("Tensor::from_vector: " + std::to_string(values.size()) + " values do not fill shape " + shape_to_string(shape));
  Tensor tensor = empty(std::move(shape), dtype_of<T>());
  T* out = tensor.mutable_data<T>();
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = values[i];
  return tensor;
}

template <class T>
const T* Tensor::data() const {
  if (!element_type_matches<T>(dtype_)) throw_type_mismatch(element_type_name<T>());
  return static_cast<const T*>(data_ptr());
}

template <class T>
T* Tensor::mutable_data() {
  if (!element_type_matches<T>(dtype_)) throw_type_mismatch(element_type_name<T>());
  return static_cast<T*>(mutable_data_ptr());
}

template <class T>
T Tensor::at(const std::vector<int64_t>& index) const {
  if (!element_type_matches<T>(dtype_)) throw_type_mismatch(element_type_name<T>());
  const std::size_t byte_offset = element_byte_offset(index);
  T value;
  std::memcpy(&value, storage_->data() + byte_offset, sizeof(T));
  return value;
}

}  // namespace cubevec
