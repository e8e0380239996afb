// The Linears of a block's parameter table swapped for quantized ones, as `cubevec quantize` plus a
// run with --quant would do (static W8A8 takes the block inputs' [-4, 4] as its calibrated range).
// Shared by the `quant` suite and the `blocks` suite's best-path rows; and how close a lossy
// path's output stays to the exact one (the `blocks` best path, the `attention` suite's int8 row).
#pragma once

#include "device/stream.h"
#include "models/parameters.h"
#include "quant/algorithm.h"
#include "tensor/tensor.h"

namespace cubevec::bench {

void quantize_block(models::ParameterTable& table, quant::Algorithm algorithm);

// The cosine of two outputs as flat vectors (f32 or bf16 tensors of one size).
double output_cosine(const Tensor& a, const Tensor& b, const Stream& stream);

}  // namespace cubevec::bench
