// The quantization exporter behind `cubevec quantize`: calibration runs of the float model record
// every Linear's input range (per tensor, and per denoising step for W8A8_TIMESTEP), then the
// int8 weights, scales and biases are computed as msModelSlim computes them
// (calculate_int_qparam; docs/stages.md, "msModelSlim's quantization parameters") and written as
// MindIE SD's files:
//   weights      symmetric per output channel: s = max(|W_o|) / 127, W_q = clamp(rint(W / s), -128, 127)
//   activations  (static) asymmetric per tensor over the calibration data: min <= 0 <= max,
//                scale = max(max / 255 - min / 255, eps), offset = rint(-min / scale) - 128
//   static       deq_scale = input_scale * s_o, quant_bias = rint(bias / deq_scale - offset * sum_k W_q[o, k])
// and a per-layer report: the cosine of the quantized layer's output against the float one on
// rows of the calibration inputs, worst first.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pipelines/stage.h"
#include "quant/files.h"

namespace cubevec::pipelines {

struct QuantExportOptions {
  quant::Algorithm algorithm = quant::Algorithm::w8a8_dynamic;
  std::vector<std::string> exclude;  // glob patterns ('*', '?') over module names: kept float
  bool deq_scale_int64 = false;      // write deq_scale as i64 bit patterns (as for MindIE's fp16 models)
  int64_t sample_rows = 256;         // calibration rows kept per layer for the report
};

// Whether `name` matches the glob `pattern` ('*' any run, '?' one character).
bool glob_match(const std::string& pattern, const std::string& name);

// Installed on a loaded model, observes every Linear not excluded while the float model runs.
class CalibrationStage : public Stage {
 public:
  explicit CalibrationStage(QuantExportOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "calibrate"; }
  void after_load(models::ParameterTable& parameters) override;
  void before_step(const models::StepInfo& step) override { *step_ = step.index; }

  struct Range {
    float min = 0, max = 0;
    bool seen = false;
    void add(float lo, float hi);
  };
  struct LayerStats {
    Range all;
    std::map<int, Range> by_step;
    Tensor sample;  // f32 [rows, in]: calibration rows from the last forward
    int sample_step = 0;
  };
  const std::map<std::string, std::shared_ptr<LayerStats>>& stats() const { return stats_; }
  const std::vector<std::string>& excluded() const { return excluded_; }
  // Takes the observing kernels out again (the model is float as it was loaded).
  void detach(models::ParameterTable& parameters);

 private:
  QuantExportOptions options_;
  std::shared_ptr<int> step_ = std::make_shared<int>(0);
  std::map<std::string, std::shared_ptr<LayerStats>> stats_;
  std::vector<std::string> excluded_;
};

struct QuantLayerReport {
  std::string module;
  double cosine = 0;  // quantized vs float output on the layer's calibration rows
};

struct QuantExportResult {
  std::string description_path, weight_path;
  std::vector<QuantLayerReport> layers;  // worst first
  std::vector<std::string> excluded;
  std::size_t int8_bytes = 0, float_bytes = 0;
};

// Computes every observed layer's quantized tensors and writes the files into `dir`. `steps`: the
// calibration runs' step count (W8A8_TIMESTEP keeps one row of static scales per step).
QuantExportResult export_quantized(models::ParameterTable& parameters, const CalibrationStage& calibration,
                                   const QuantExportOptions& options, int steps, const std::string& dir);

}  // namespace cubevec::pipelines
