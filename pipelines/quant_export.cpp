#include "pipelines/quant_export.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "models/layers.h"
#include "ops/vector_ops.h"
#include "quant/calibration.h"
#include "quant/schemes.h"
#include "base/error.h"

namespace cubevec::pipelines {

namespace {

std::vector<float> host_f32(const Tensor& t) {
  const Tensor c = ops::cast(t, DType::f32).contiguous();
  return std::vector<float>(c.data<float>(), c.data<float>() + c.numel());
}

// Runs the float product and records the input range (and a sample of rows) of one Linear.
class ObserveKernel : public models::LinearKernel {
 public:
  ObserveKernel(std::shared_ptr<CalibrationStage::LayerStats> stats, std::shared_ptr<int> step, int64_t sample_rows)
      : stats_(std::move(stats)), step_(std::move(step)), sample_rows_(sample_rows) {}
  std::string name() const override { return "calibration observer"; }
  Tensor forward(const models::Linear& layer, const Tensor& x, const Stream& s, const ops::MatmulOptions& epilogue) const override {
    if (x.numel() == 0) return layer.float_forward(x, s, epilogue);  // no rows: nothing observed
    const std::vector<float> v = host_f32(x);
    float lo = std::numeric_limits<float>::infinity(), hi = -lo;
    for (float f : v) {
      if (!std::isfinite(f))
        throw Error("calibration: layer '" + layer.name + "' received a non-finite input at step " + std::to_string(*step_));
      lo = std::min(lo, f), hi = std::max(hi, f);
    }
    stats_->all.add(lo, hi);
    stats_->by_step[*step_].add(lo, hi);
    const int64_t rows = std::min(sample_rows_, x.size(0));
    stats_->sample = Tensor::from_vector(std::vector<float>(v.begin(), v.begin() + rows * x.size(1)), {rows, x.size(1)});
    stats_->sample_step = *step_;
    return layer.float_forward(x, s, epilogue);
  }
  std::size_t weight_bytes() const override { return 0; }

 private:
  std::shared_ptr<CalibrationStage::LayerStats> stats_;
  std::shared_ptr<int> step_;
  int64_t sample_rows_;
};

double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) ab += a[i] * b[i], aa += a[i] * a[i], bb += b[i] * b[i];
  return aa == 0 && bb == 0 ? 1.0 : ab / std::sqrt(std::max(aa * bb, 1e-300));
}

}  // namespace

bool glob_match(const std::string& pattern, const std::string& name) {
  std::size_t p = 0, n = 0, star = std::string::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) ++p, ++n;
    else if (p < pattern.size() && pattern[p] == '*') star = p++, mark = n;
    else if (star != std::string::npos) p = star + 1, n = ++mark;
    else return false;
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

void CalibrationStage::Range::add(float lo, float hi) {
  if (!seen) min = lo, max = hi, seen = true;
  else min = std::min(min, lo), max = std::max(max, hi);
}

void CalibrationStage::after_load(models::ParameterTable& table) {
  for (const auto& [module_name, linear] : table.linears()) {
    const std::string& name = module_name;  // clang cannot capture a structured binding
    const bool excluded =
        std::any_of(options_.exclude.begin(), options_.exclude.end(), [&](const std::string& p) { return glob_match(p, name); });
    if (excluded) {
      excluded_.push_back(name);
      continue;
    }
    auto stats = std::make_shared<LayerStats>();
    stats_[name] = stats;
    linear->kernel = std::make_shared<ObserveKernel>(stats, step_, options_.sample_rows);
  }
}

void CalibrationStage::detach(models::ParameterTable& table) {
  for (const auto& [name, stats] : stats_) table.linear(name).kernel = nullptr;
}

QuantExportResult export_quantized(models::ParameterTable& table, const CalibrationStage& calibration, const QuantExportOptions& o,
                                   int steps, const std::string& dir) {
  quant::Writer writer;
  writer.algo = std::string(quant::algorithm_name(o.algorithm));
  writer.deq_scale_int64 = o.deq_scale_int64;
  QuantExportResult result;
  result.excluded = calibration.excluded();
  const auto policy = std::make_shared<quant::TimestepPolicy>();  // the report's timestep layers: static at their sample's step
  policy->set_default(quant::Strategy::static_scales);
  std::map<std::string, bool> written;  // parameter names the quantized layers wrote
  for (const auto& [module_name, layer_stats] : calibration.stats()) {
    const std::string& name = module_name;  // clang cannot capture a structured binding
    const auto& stats = layer_stats;
    const models::Linear& layer = table.linear(name);
    if (!stats->all.seen) throw Error("calibration never ran layer '" + name + "': it cannot be quantized (exclude it with --exclude)");
    const int64_t out = layer.out, in = layer.in;
    std::vector<quant::ActivationRange> ranges;
    if (o.algorithm == quant::Algorithm::w8a8) ranges.push_back({stats->all.min, stats->all.max});
    if (o.algorithm == quant::Algorithm::w8a8_timestep)
      for (int s = 0; s < steps; ++s) {  // a step the layer never ran in takes the overall range
        const auto it = stats->by_step.find(s);
        const CalibrationStage::Range& r = it == stats->by_step.end() ? stats->all : it->second;
        ranges.push_back({r.min, r.max});
      }
    const quant::QuantTensors t = quant::quantize_layer(layer.weight, layer.bias, o.algorithm, ranges);
    quant::QuantTensors file_tensors = t;
    if (layer.bias.defined()) file_tensors.bias = ops::cast(layer.bias, DType::f32).contiguous();  // kept as FLOAT, also for W8A8
    writer.add_layer(name, o.algorithm, file_tensors);
    written[name + ".weight"] = true;
    if (layer.bias.defined()) written[name + ".bias"] = true;

    // The report: this layer quantized against float on its calibration rows.
    const auto q = quant::make_quantized_linear(o.algorithm, in, out, t, policy, "export: " + name);
    const Tensor x = stats->sample;
    const std::vector<double> got = [&] {
      const Tensor y = q->forward(x, {}, stats->sample_step, ops::default_op_stream());
      const std::vector<float> v = host_f32(y);
      return std::vector<double>(v.begin(), v.end());
    }();
    const std::vector<float> ref = host_f32(layer.float_forward(x, ops::default_op_stream()));
    result.layers.push_back({name, cosine(got, std::vector<double>(ref.begin(), ref.end()))});
    result.int8_bytes += q->weight_bytes();
  }
  // Every other parameter, as msModelSlim writes the whole model into the file (FLOAT).
  for (const auto& spec : table.specs())
    if (!written.count(spec.name) && spec.slot->has_storage()) {
      writer.add_float(spec.name, spec.slot->contiguous());
      result.float_bytes += spec.slot->nbytes();
    }
  writer.save(dir);
  result.description_path = quant::description_file(dir, writer.algo);
  result.weight_path = quant::weight_file(dir, writer.algo);
  std::sort(result.layers.begin(), result.layers.end(), [](const auto& a, const auto& b) { return a.cosine < b.cosine; });
  return result;
}

}  // namespace cubevec::pipelines
