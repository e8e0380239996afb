// A fixed-size array in the caching allocator's memory: what long-lived kernel data (a weight's
// packed GEMM panels) is kept in, so that it counts in the allocator's statistics and peak like
// every tensor, and a --memory-limit refuses it with the same error.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "tensor/caching_allocator.h"

namespace cubevec {

template <class T>
class AllocatedArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  AllocatedArray() = default;
  ~AllocatedArray() { reset(); }
  AllocatedArray(AllocatedArray&& other) noexcept : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  AllocatedArray& operator=(AllocatedArray&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  AllocatedArray(const AllocatedArray&) = delete;
  AllocatedArray& operator=(const AllocatedArray&) = delete;

  // `count` copies of `value` (replacing what was held).
  void assign(std::size_t count, T value) {
    assign_for_overwrite(count);
    std::fill_n(data_, size_, value);
  }
  // `count` elements left unset, for a buffer its user writes in full before reading (replacing
  // what was held).
  void assign_for_overwrite(std::size_t count) {
    reset();
    if (count == 0) return;
    data_ = static_cast<T*>(default_allocator().allocate(count * sizeof(T)));
    size_ = count;
  }
  void reset() {
    if (data_) default_allocator().deallocate(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace cubevec
