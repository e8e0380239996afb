#include "bench/quantized_block.h"

#include <vector>

#include "models/layers.h"
#include "pipelines/stages/quantize.h"
#include "quant/calibration.h"
#include "quant/schemes.h"

namespace cubevec::bench {

void quantize_block(models::ParameterTable& table, quant::Algorithm algorithm) {
  for (const auto& [name, linear] : table.linears()) {
    const std::vector<quant::ActivationRange> ranges =
        algorithm == quant::Algorithm::w8a8 ? std::vector<quant::ActivationRange>{{-4.0f, 4.0f}} : std::vector<quant::ActivationRange>{};
    const quant::QuantTensors t = quant::quantize_layer(linear->weight, linear->bias, algorithm, ranges);
    pipelines::install_quantized(*linear, quant::make_quantized_linear(algorithm, linear->in, linear->out, t, nullptr, name));
  }
}

}  // namespace cubevec::bench
