// Shapes and strides (in elements) and the arithmetic on them that views need.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace cubevec {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

// "[2, 3, 4]"
std::string shape_to_string(std::span<const int64_t> shape);

// Product of the sizes; throws cubevec::Error on a negative size or on overflow of int64.
int64_t shape_numel(std::span<const int64_t> shape);

// Row-major strides for `shape`.
Strides contiguous_strides(std::span<const int64_t> shape);

// A dimension index that may be negative (counted from the end), checked against `rank`.
// `what` names the operation for the error message.
int64_t wrap_dim(int64_t dim, int64_t rank, const char* what);

// a / b rounded up, for positive b and non-negative a: the number of tiles or blocks covering a.
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Resolves one -1 in `shape` so its product equals `numel`; throws naming both shapes otherwise.
Shape infer_shape(std::span<const int64_t> shape, int64_t numel, std::span<const int64_t> from_shape);

}  // namespace cubevec
