// Non-finite values are never silent: inputs a user hands over (prompt embeddings, forward
// inputs, q / k / v of a porting check) are checked when loaded, and an error names the tensor,
// the first bad element's index and its value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tensor/tensor.h"

namespace cubevec {

// The flat (row-major) index of the first NaN or infinity of a float tensor (f32, f16, bf16) with
// storage; nullopt when all are finite or the dtype is not a float.
std::optional<int64_t> first_non_finite(const Tensor& t);

// Throws "<what>: element [i, j, ...] is nan (expected finite values)".
void require_finite(const Tensor& t, const std::string& what);

}  // namespace cubevec
