// The view operations of Tensor: new shape/strides/offset over the same storage.
#include <optional>

#include "tensor/tensor.h"

namespace cubevec {

namespace {

// Strides that let `new_shape` walk the same elements as (old_shape, old_strides) in row-major
// order, or nullopt when no such strides exist. Old dims are grouped into runs that are contiguous
// with each other; each run must be split exactly by a run of new dims.
std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& new_shape) {
  Strides new_strides(new_shape.size());
  if (shape_numel(old_shape) == 0 || old_shape.empty()) return contiguous_strides(new_shape);
  int64_t new_dim = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t run_base_stride = old_strides.back();
  int64_t run_numel = 1;
  int64_t new_numel = 1;
  for (int64_t old_dim = static_cast<int64_t>(old_shape.size()) - 1; old_dim >= 0; --old_dim) {
    run_numel *= old_shape[old_dim];
    const bool run_ends = old_dim == 0 || (old_shape[old_dim - 1] != 1 && old_strides[old_dim - 1] != run_numel * run_base_stride);
    if (!run_ends) continue;
    while (new_dim >= 0 && (new_numel < run_numel || new_shape[new_dim] == 1)) {
      new_strides[new_dim] = new_numel * run_base_stride;
      new_numel *= new_shape[new_dim];
      --new_dim;
    }
    if (new_numel != run_numel) return std::nullopt;
    if (old_dim > 0) {
      run_base_stride = old_strides[old_dim - 1];
      run_numel = 1;
      new_numel = 1;
    }
  }
  if (new_dim != -1) return std::nullopt;
  return new_strides;
}

}  // namespace

Tensor Tensor::with_layout(Shape shape, Strides strides, int64_t offset) const {
  Tensor result = *this;
  result.shape_ = std::move(shape);
  result.strides_ = std::move(strides);
  result.offset_ = offset;
  return result;
}

Tensor Tensor::view(const Shape& shape) const {
  const Shape resolved = infer_shape(shape, numel(), shape_);
  auto strides = view_strides(shape_, strides_, resolved);
  if (!strides)
    throw Error("cannot view " + describe() + " as shape " + shape_to_string(resolved) +
                " without copying (its strides do not allow it); use reshape() or contiguous() first");
  return with_layout(resolved, std::move(*strides), offset_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  const Shape resolved = infer_shape(shape, numel(), shape_);
  if (auto strides = view_strides(shape_, strides_, resolved)) return with_layout(resolved, std::move(*strides), offset_);
  return contiguous().view(resolved);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  if (static_cast<int64_t>(dims.size()) != dim())
    throw Error("permute: " + shape_to_string(dims) + " has " + std::to_string(dims.size()) +
                " entries, expected one per dimension of shape " + shape_to_string(shape_));
  Shape shape(dims.size());
  Strides strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    if (seen[d]) throw Error("permute: " + shape_to_string(dims) + " repeats dimension " + std::to_string(d));
    seen[d] = true;
    shape[i] = shape_[d];
    strides[i] = strides_[d];
  }
  return with_layout(std::move(shape), std::move(strides), offset_);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  const int64_t a = wrap_dim(dim0, dim(), "transpose");
  const int64_t b = wrap_dim(dim1, dim(), "transpose");
  Shape shape = shape_;
  Strides strides = strides_;
  std::swap(shape[a], shape[b]);
  std::swap(strides[a], strides[b]);
  return with_layout(std::move(shape), std::move(strides), offset_);
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  const int64_t d = wrap_dim(dim, this->dim(), "narrow");
  if (start < 0 || length < 0 || start > shape_[d] - length)
    throw Error("narrow: start " + std::to_string(start) + " and length " + std::to_string(length) + " do not fit dimension " +
                std::to_string(d) + " of size " + std::to_string(shape_[d]) + " in shape " + shape_to_string(shape_));
  Shape shape = shape_;
  shape[d] = length;
  return with_layout(std::move(shape), strides_, offset_ + start * strides_[d]);
}

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  const int64_t d = wrap_dim(dim, this->dim(), "slice");
  const int64_t size = shape_[d];
  const int64_t first = start < 0 ? start + size : start;
  const int64_t last = end < 0 ? end + size : end;
  if (step <= 0) throw Error("slice: step must be positive, got " + std::to_string(step));
  if (first < 0 || last > size || first > last)
    throw Error("slice: [" + std::to_string(start) + ", " + std::to_string(end) + ") is out of range for dimension " + std::to_string(d) +
                " of size " + std::to_string(size) + " in shape " + shape_to_string(shape_));
  Shape shape = shape_;
  Strides strides = strides_;
  shape[d] = (last - first + step - 1) / step;
  strides[d] = strides_[d] * step;
  return with_layout(std::move(shape), std::move(strides), offset_ + first * strides_[d]);
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  const int64_t d = wrap_dim(dim, this->dim(), "select");
  const int64_t i = index < 0 ? index + shape_[d] : index;
  if (i < 0 || i >= shape_[d])
    throw Error("select: index " + std::to_string(index) + " is out of range for dimension " + std::to_string(d) + " of size " +
                std::to_string(shape_[d]) + " in shape " + shape_to_string(shape_));
  Shape shape = shape_;
  Strides strides = strides_;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return with_layout(std::move(shape), std::move(strides), offset_ + i * strides_[d]);
}

Tensor Tensor::expand(const Shape& shape) const {
  const std::string what = "expand: cannot expand shape " + shape_to_string(shape_) + " to " + shape_to_string(shape);
  if (shape.size() < shape_.size()) throw Error(what + ": the target has fewer dimensions");
  const std::size_t lead = shape.size() - shape_.size();
  Shape out_shape(shape.size());
  Strides out_strides(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {  // new leading dimension: broadcast
      if (shape[i] < 0) throw Error(what + ": a new leading dimension needs an explicit size");
      out_shape[i] = shape[i];
      out_strides[i] = 0;
      continue;
    }
    const int64_t have = shape_[i - lead];
    const int64_t want = shape[i] == -1 ? have : shape[i];
    if (want == have) {
      out_shape[i] = have;
      out_strides[i] = strides_[i - lead];
    } else if (have == 1 && want >= 0) {
      out_shape[i] = want;
      out_strides[i] = 0;
    } else {
      throw Error(what + ": dimension " + std::to_string(i) + " has size " + std::to_string(have) + ", which is neither 1 nor " +
                  std::to_string(want));
    }
  }
  return with_layout(std::move(out_shape), std::move(out_strides), offset_);
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  const int64_t d = wrap_dim(dim, this->dim() + 1, "unsqueeze");
  Shape shape = shape_;
  Strides strides = strides_;
  // The stride of a size-1 dim is never used to step; pick what keeps the layout contiguous.
  const int64_t stride = d < this->dim() ? strides_[d] * shape_[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return with_layout(std::move(shape), std::move(strides), offset_);
}

Tensor Tensor::squeeze(int64_t dim) const {
  const int64_t d = wrap_dim(dim, this->dim(), "squeeze");
  if (shape_[d] != 1)
    throw Error("squeeze: dimension " + std::to_string(d) + " of shape " + shape_to_string(shape_) + " has size " +
                std::to_string(shape_[d]) + ", expected 1");
  return select(d, 0);
}

}  // namespace cubevec
