#include "pipelines/stages/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "models/layers.h"
#include "ops/vector_ops.h"
#include "tensor/safetensors.h"
#include "base/error.h"

namespace cubevec::pipelines {

namespace {

// The step this thread's denoising loop is at. Per thread, not per stage: a loaded pipeline's
// quantized layers are shared by every request, and each request runs its forwards on its own
// host thread (the launches, where the step picks the scales, happen there).
thread_local int t_quant_step = 0;

// A quantized scheme behind a Linear: the layer's product, at the calling thread's step.
class QuantKernel : public models::LinearKernel {
 public:
  explicit QuantKernel(std::shared_ptr<const quant::QuantizedLinear> q) : q_(std::move(q)) {}
  std::string name() const override { return std::string(quant::algorithm_name(q_->algorithm())); }
  Tensor forward(const models::Linear&, const Tensor& x, const Stream& s, const ops::MatmulOptions& epilogue) const override {
    return q_->forward(x, epilogue, t_quant_step, s);
  }
  std::size_t weight_bytes() const override { return q_->weight_bytes(); }

 private:
  std::shared_ptr<const quant::QuantizedLinear> q_;
};

// Shape-only tensors of `algorithm` for a Linear (simulate mode); W8A8_TIMESTEP with `steps` rows.
quant::QuantTensors meta_tensors(quant::Algorithm algorithm, const models::Linear& l, int steps) {
  quant::QuantTensors t;
  t.weight = Tensor::meta({l.out, l.in}, DType::i8);
  t.weight_scale = Tensor::meta({l.out}, DType::f32);
  if (l.bias.defined()) t.bias = Tensor::meta({l.out}, DType::f32);
  if (algorithm == quant::Algorithm::w8a8 || algorithm == quant::Algorithm::w8a8_timestep) {
    const int64_t rows = algorithm == quant::Algorithm::w8a8 ? 1 : std::max(steps, 1);
    t.input_scale = Tensor::meta({rows}, DType::f32);
    t.input_offset = Tensor::meta({rows}, DType::f32);
    t.deq_scale = algorithm == quant::Algorithm::w8a8 ? Tensor::meta({l.out}, DType::f32) : Tensor::meta({rows, l.out}, DType::f32);
    t.quant_bias = algorithm == quant::Algorithm::w8a8 ? Tensor::meta({l.out}, DType::i32) : Tensor::meta({rows, l.out}, DType::i32);
  }
  if (algorithm == quant::Algorithm::w8a8) t.bias = Tensor();
  return t;
}

// The weight file holds the whole model (msModelSlim writes the float parameters too, FLOAT in the
// description): those must be this model's own, or the description was made for another model or
// expert with the same module names, and would give a silently wrong picture. Compared in f32 at
// bf16's precision (the model may hold bf16 roundings of the file's values).
void require_own_float_weights(const models::ParameterTable& table, const quant::Description& d, const SafetensorsFile& weights,
                               const std::string& model) {
  for (const auto& spec : table.specs()) {
    const auto entry = d.entries.find(spec.name);
    if (!spec.slot->has_storage() || entry == d.entries.end() || entry->second != "FLOAT" || !weights.contains(spec.name)) continue;
    const Tensor file = ops::cast(weights.tensor(spec.name), DType::f32).contiguous();
    const Tensor own = ops::cast(*spec.slot, DType::f32).contiguous();
    const auto mismatch = [&](const std::string& how) {
      return Error(d.path + ": its weight file's FLOAT tensor '" + spec.name + "' " + how + " " + (model.empty() ? "transformer/" : model) +
                   "'s own: the description was made for another model or expert (a two-expert model takes --quant for transformer/ "
                   "and --quant-2 for transformer_2/)");
    };
    if (file.shape() != own.shape()) throw mismatch("has another shape than");
    const float* a = file.data<float>();
    const float* b = own.data<float>();
    for (int64_t i = 0; i < file.numel(); ++i)
      if (!(std::fabs(a[i] - b[i]) <= 1e-2f * std::max(std::fabs(a[i]), std::fabs(b[i])) + 1e-6f))
        throw mismatch("differs (element " + std::to_string(i) + ": " + std::to_string(a[i]) + " against " + std::to_string(b[i]) +
                       ") from");
  }
}

}  // namespace

QuantizeStage::QuantizeStage(QuantizeOptions options) : options_(std::move(options)) {
  if (options_.description.empty()) throw Error("--quant needs a quant_model_description_*.json file");
  if (!options_.simulate && !options_.description.ends_with(".json") && !std::filesystem::exists(options_.description) &&
      quant::is_mindie_algorithm(options_.description))
    throw Error("--quant " + options_.description +
                ": an algorithm name stands for shape-only weights with --simulate; a real run "
                "needs a quant_model_description_*.json (cubevec quantize writes one)");
  if (options_.simulate && !options_.description.ends_with(".json")) {
    meta_algorithm_ = quant::parse_algorithm(options_.description, "--quant");
    if (!meta_algorithm_)
      throw Error("--quant " + options_.description +
                  ": MindIE SD names that algorithm, but cubevec runs W8A16, W8A8, W8A8_DYNAMIC, W8A8_TIMESTEP");
  } else {
    description_ = quant::Description::load(options_.description);
  }
  if (!options_.description_2.empty()) {
    if (meta_algorithm_)
      throw Error("--quant-2 " + options_.description_2 + ": with an algorithm name, --quant " + options_.description +
                  " quantizes both experts already (simulate mode); --quant-2 takes the second expert's description file beside a "
                  "description file");
    description_2_ = quant::Description::load(options_.description_2);
  }
  policy_ = std::make_shared<const quant::TimestepPolicy>(
      options_.timestep_policy.empty() ? quant::TimestepPolicy() : quant::TimestepPolicy::load(options_.timestep_policy));
}

std::string QuantizeStage::name() const {
  return "quantize " + (meta_algorithm_ ? std::string(quant::algorithm_name(*meta_algorithm_)) : description_->model_quant_type);
}

void QuantizeStage::after_load(models::ParameterTable& table) { quantize(table, description_ ? &*description_ : nullptr, ""); }

void QuantizeStage::after_load_second_model(models::ParameterTable& table) {
  // A description file names one model's modules: the second expert has its own (--quant-2). In
  // simulate mode an algorithm name quantizes every block Linear, of both experts alike.
  if (!meta_algorithm_ && !description_2_)
    throw Error("--quant " + options_.description +
                " describes transformer/ only: a two-expert model needs the low-noise expert's description too, --quant-2 "
                "FILE for transformer_2/ (cubevec quantize on the folder writes it into its --out folder's transformer_2/)");
  quantize(table, description_2_ ? &*description_2_ : nullptr, "transformer_2/");
}

void QuantizeStage::quantize(models::ParameterTable& table, const quant::Description* description, const std::string& model) {
  if (table.linears().empty()) throw Error("--quant " + options_.description + ": this model has no Linear layers to quantize");
  std::vector<std::pair<models::Linear*, std::shared_ptr<const quant::QuantizedLinear>>> built;
  if (meta_algorithm_) {
    for (const auto& [name, linear] : table.linears())
      if (name.find("blocks.") != std::string::npos)
        built.push_back({linear, quant::make_quantized_linear(*meta_algorithm_, linear->in, linear->out,
                                                              meta_tensors(*meta_algorithm_, *linear, options_.simulate_steps), policy_,
                                                              "--quant " + options_.description + ": " + name)});
  } else {
    const quant::Description& d = *description;
    // Every module the description quantizes must be a Linear of the model.
    for (const std::string& module : d.quantized_modules())
      if (!table.linears().count(module)) {
        try {
          table.linear(module);
        } catch (const Error& e) {
          throw Error(d.path + ": module '" + module + "' is not a Linear of this model (" + e.what() + ")");
        }
      }
    const std::string weights_path = d.weight_path();
    const SafetensorsFile weights = SafetensorsFile::open(weights_path);
    require_own_float_weights(table, d, weights, model);
    for (const auto& [name, linear] : table.linears()) {
      const std::optional<std::string> value = d.algorithm_value(name);
      if (!value) continue;
      const std::optional<quant::Algorithm> algorithm = quant::parse_algorithm(*value, d.path + ": module '" + name + "'");
      if (!algorithm)
        throw Error(d.path + ": module '" + name + "' is quantized as " + *value +
                    ", which cubevec does not run (it runs W8A16, W8A8, W8A8_DYNAMIC, W8A8_TIMESTEP)");
      const quant::QuantTensors tensors = quant::read_layer_tensors(weights, name, *algorithm, linear->bias.defined());
      built.push_back({linear, quant::make_quantized_linear(*algorithm, linear->in, linear->out, tensors, policy_,
                                                            weights_path + ": layer '" + name + "'")});
    }
  }
  // Everything read and checked: swap, and release the float weights of the swapped layers.
  for (auto& [linear, q] : built) {
    if (q->static_steps() > 0) static_rows_[model + linear->name] = q->static_steps();
    install_quantized(*linear, q);
    swapped_[model + linear->name] = std::string(quant::algorithm_name(q->algorithm()));
    quantized_bytes_ += q->weight_bytes();
  }
  if (model.empty()) float_bytes_ = 0;  // a second model's add to the first's
  for (const auto& spec : table.specs())
    if (spec.slot->has_storage()) float_bytes_ += spec.slot->nbytes();
}

void install_quantized(models::Linear& layer, std::shared_ptr<const quant::QuantizedLinear> scheme) {
  layer.kernel = std::make_shared<QuantKernel>(std::move(scheme));
  layer.weight = Tensor::meta(layer.weight.shape(), layer.weight.dtype());
  layer.pack_cache = std::make_shared<models::Linear::PackCache>();
}

void QuantizeStage::check_static_rows(int first, int count) const {
  for (int step = first; step < first + count; ++step) {
    if (policy_->strategy(step) != quant::Strategy::static_scales) continue;
    for (const auto& [module, rows] : static_rows_)
      if (step >= rows)
        throw Error(
            (module.starts_with("transformer_2/") && description_2_ ? description_2_->weight_path()
             : description_                                         ? description_->weight_path()
                                                                    : options_.description) +
            ": layer '" + module + "' has static scales for " + std::to_string(rows) + " steps (0 to " + std::to_string(rows - 1) +
            "), but " +
            (options_.timestep_policy.empty() ? std::string("the timestep policy") : "the timestep policy " + options_.timestep_policy) +
            " makes step " + std::to_string(step) + " static");
  }
}

void QuantizeStage::begin_run(const RunInfo& run) {
  // Checked over every model quantized (two experts: either may hold the W8A8_TIMESTEP layers).
  if (!options_.timestep_policy.empty() && static_rows_.empty())
    throw Error("--timestep-policy " + options_.timestep_policy + " applies to W8A8_TIMESTEP layers, but --quant " + options_.description +
                (options_.description_2.empty() ? "" : " and --quant-2 " + options_.description_2) + " quantize none");
  check_static_rows(0, run.steps);
}
void QuantizeStage::before_step(const models::StepInfo& step) { t_quant_step = step.index; }
void QuantizeStage::set_step(int step) {
  check_static_rows(step, 1);
  t_quant_step = step;
}

std::string QuantizeStage::summary() const {
  return std::to_string(swapped_.size()) + " Linears quantized; weights: " + mib(quantized_bytes_, 2) + " int8 (with scales), " +
         mib(float_bytes_, 2) + " float" + (meta_algorithm_ ? " (simulate: shape-only)" : "");
}

nlohmann::ordered_json QuantizeStage::report() const {
  std::map<std::string, int> counts;
  for (const auto& [module, algo] : swapped_) ++counts[algo];
  nlohmann::ordered_json j = {{"description", options_.description},
                              {"timestep_policy", options_.timestep_policy},
                              {"layers", counts},
                              {"int8_weight_bytes", quantized_bytes_},
                              {"float_weight_bytes", float_bytes_}};
  if (!options_.description_2.empty()) j["description_2"] = options_.description_2;
  return j;
}

}  // namespace cubevec::pipelines
