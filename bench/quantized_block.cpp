#include "bench/quantized_block.h"

#include <cmath>
#include <vector>

#include "models/layers.h"
#include "ops/vector_ops.h"
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

double output_cosine(const Tensor& a, const Tensor& b, const Stream& stream) {
  const Tensor fa = ops::cast(a, DType::f32, stream).contiguous(), fb = ops::cast(b, DType::f32, stream).contiguous();
  const float* x = fa.data<float>();
  const float* y = fb.data<float>();
  double dot = 0, xx = 0, yy = 0;
  for (int64_t i = 0; i < fa.numel(); ++i) dot += double(x[i]) * y[i], xx += double(x[i]) * x[i], yy += double(y[i]) * y[i];
  return dot / std::sqrt(xx * yy);
}

}  // namespace cubevec::bench
