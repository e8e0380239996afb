#include "tensor/tensor.h"

#include <cstring>

namespace cubevec {

namespace {

// Highest element offset a layout reaches, plus one; 0 for an empty tensor. Strides are >= 0.
int64_t extent_in_elements(const Shape& shape, const Strides& strides, int64_t offset) {
  int64_t last = offset;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return 0;
    int64_t reach;
    if (__builtin_mul_overflow(shape[i] - 1, strides[i], &reach) || __builtin_add_overflow(last, reach, &last))
      throw Error("tensor layout overflows int64: shape " + shape_to_string(shape) + ", strides " + shape_to_string(strides));
  }
  return last + 1;
}

}  // namespace

Tensor::Tensor(std::shared_ptr<Storage> storage, Shape shape, Strides strides, int64_t offset, DType dtype)
    : storage_(std::move(storage)),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset),
      dtype_(dtype),
      defined_(true) {}

Tensor Tensor::empty(Shape shape, DType dtype, Allocator& allocator, StreamTag stream) {
  const int64_t numel = shape_numel(shape);
  std::size_t nbytes;
  if (__builtin_mul_overflow(static_cast<std::size_t>(numel), dtype_size(dtype), &nbytes))
    throw Error("Tensor::empty: shape " + shape_to_string(shape) + " of " + std::string(dtype_name(dtype)) +
                " needs more bytes than the address space holds");
  Strides strides = contiguous_strides(shape);
  return Tensor(Storage::allocate(nbytes, allocator, stream), std::move(shape), std::move(strides), 0, dtype);
}

Tensor Tensor::zeros(Shape shape, DType dtype, Allocator& allocator) {
  Tensor tensor = empty(std::move(shape), dtype, allocator);
  std::memset(tensor.mutable_data_ptr(), 0, tensor.nbytes());
  return tensor;
}

Tensor Tensor::meta(Shape shape, DType dtype) {
  shape_numel(shape);  // validates
  const auto nbytes = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  Strides strides = contiguous_strides(shape);
  return Tensor(Storage::meta(nbytes), std::move(shape), std::move(strides), 0, dtype);
}

Tensor Tensor::from_storage(std::shared_ptr<Storage> storage, Shape shape, Strides strides, int64_t offset, DType dtype) {
  const std::string layout =
      "shape " + shape_to_string(shape) + ", strides " + shape_to_string(strides) + ", offset " + std::to_string(offset);
  if (!storage) throw Error("Tensor::from_storage: no storage given for " + layout);
  if (strides.size() != shape.size()) throw Error("Tensor::from_storage: rank of strides differs from rank of " + layout);
  shape_numel(shape);
  if (offset < 0) throw Error("Tensor::from_storage: negative offset in " + layout);
  for (int64_t s : strides)
    if (s < 0) throw Error("Tensor::from_storage: negative stride in " + layout);
  const int64_t extent = extent_in_elements(shape, strides, offset);
  const auto capacity = static_cast<int64_t>(storage->nbytes() / dtype_size(dtype));
  if (extent > capacity)
    throw Error("Tensor::from_storage: " + layout + " of " + std::string(dtype_name(dtype)) + " reaches element " +
                std::to_string(extent - 1) + " but the storage holds " + std::to_string(capacity) + " elements");
  return Tensor(std::move(storage), std::move(shape), std::move(strides), offset, dtype);
}

int64_t Tensor::size(int64_t dim) const { return shape_[wrap_dim(dim, this->dim(), "Tensor::size")]; }

int64_t Tensor::stride(int64_t dim) const { return strides_[wrap_dim(dim, this->dim(), "Tensor::stride")]; }

int64_t Tensor::numel() const { return shape_numel(shape_); }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (std::size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 0) return true;
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

std::string Tensor::describe() const {
  if (!defined_) return "Tensor(undefined)";
  return "Tensor(" + std::string(dtype_name(dtype_)) + ", shape " + shape_to_string(shape_) + ", strides " + shape_to_string(strides_) +
         ", offset " + std::to_string(offset_) + (has_storage() ? "" : ", meta") + ")";
}

std::string Tensor::brief() const {
  if (!defined_) return "nothing";
  return std::string(dtype_name(dtype_)) + " " + shape_to_string(shape_);
}

const void* Tensor::data_ptr() const {
  if (!has_storage()) throw Error("cannot access the data of " + describe() + ": it has no storage (a meta tensor from simulate mode)");
  return storage_->data() + offset_ * static_cast<int64_t>(itemsize());
}

std::byte* Tensor::unsynchronized_data_ptr() const {
  if (!has_storage()) data_ptr();  // throws the meta-tensor error
  return storage_->unsynchronized_data() + offset_ * static_cast<int64_t>(itemsize());
}

void* Tensor::mutable_data_ptr() {
  data_ptr();  // same checks
  return storage_->mutable_data() + offset_ * static_cast<int64_t>(itemsize());
}

void Tensor::throw_type_mismatch(std::string_view requested) const {
  throw Error("tensor of dtype " + std::string(dtype_name(dtype_)) + " accessed as " + std::string(requested) + ": " + describe());
}

std::size_t Tensor::element_byte_offset(const std::vector<int64_t>& index) const {
  data_ptr();
  if (index.size() != shape_.size())
    throw Error("index " + shape_to_string(index) + " has rank " + std::to_string(index.size()) + ", expected rank " +
                std::to_string(shape_.size()) + " for " + describe());
  int64_t element = offset_;
  for (std::size_t i = 0; i < index.size(); ++i) {
    if (index[i] < 0 || index[i] >= shape_[i]) throw Error("index " + shape_to_string(index) + " is out of bounds for " + describe());
    element += index[i] * strides_[i];
  }
  return static_cast<std::size_t>(element) * itemsize();
}

}  // namespace cubevec
