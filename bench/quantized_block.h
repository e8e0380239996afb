// The Linears of a block's parameter table swapped for quantized ones, as `cubevec quantize` plus a
// run with --quant would do (static W8A8 takes the block inputs' [-4, 4] as its calibrated range).
// Shared by the `quant` suite and the `blocks` suite's best-path rows.
#pragma once

#include "models/parameters.h"
#include "quant/algorithm.h"

namespace cubevec::bench {

void quantize_block(models::ParameterTable& table, quant::Algorithm algorithm);

}  // namespace cubevec::bench
