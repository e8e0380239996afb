// Checks of a model's forward arguments that name the argument: its dtype is one the forward reads
// ("flux forward: timestep must be f32, bf16 or i64, got i32"), so a wrong dtype is not reported
// later by a kernel that does not know the tensor's name.
#pragma once

#include <initializer_list>
#include <string>

#include "tensor/tensor.h"

namespace cubevec::models {

// Throws "<where>: <name> must be <a, b or c>, got <dtype>" unless t's dtype is in `allowed`
// (an undefined t passes: missing arguments are the shape checks' to report).
void require_input_dtype(const Tensor& t, const std::string& where, const std::string& name, std::initializer_list<DType> allowed);

// The float dtypes a model's activations may arrive in (cast on entry).
inline constexpr std::initializer_list<DType> kFloatInputs = {DType::f32, DType::bf16, DType::f16};

}  // namespace cubevec::models
