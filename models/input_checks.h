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

// Throws "<where>: <name> holds <value> at element <i>; expected finite values ..." unless every
// value of t (f32, bf16 or f16; integer dtypes pass) times `scale` is finite in f32: a timestep or a
// guidance scale the model multiplies by 1000 must stay finite after it. Undefined tensors and
// tensors without values (simulate mode) pass.
void require_finite_values(const Tensor& t, const std::string& where, const std::string& name, double scale = 1.0);

// The float dtypes a model's activations may arrive in (cast on entry).
inline constexpr std::initializer_list<DType> kFloatInputs = {DType::f32, DType::bf16, DType::f16};

}  // namespace cubevec::models
