#include "models/parameters.h"

#include <algorithm>
#include <random>
#include <set>
#include <sstream>

#include "base/error.h"
#include "tensor/finite_check.h"
#include "tensor/half.h"

namespace cubevec::models {

namespace {

// A copy of `source` (f32, bf16 or f16) stored as `dtype`.
Tensor converted(const Tensor& source, DType dtype) {
  if (source.dtype() == dtype) return source;
  const auto n = static_cast<std::size_t>(source.numel());
  std::vector<float> f32(n);
  const Tensor src = source.contiguous();
  if (src.dtype() == DType::f32) std::copy_n(src.data<float>(), n, f32.begin());
  else if (src.dtype() == DType::bf16) convert_bf16_to_f32(src.data<uint16_t>(), f32.data(), n);
  else convert_f16_to_f32(src.data<uint16_t>(), f32.data(), n);
  if (dtype == DType::f32) return Tensor::from_vector(f32, source.shape());
  Tensor out = Tensor::empty(source.shape(), DType::bf16);
  convert_f32_to_bf16(f32.data(), out.mutable_data<uint16_t>(), n);
  return out;
}

void check_dtype(DType dtype, const char* what) {
  if (dtype != DType::f32 && dtype != DType::bf16)
    throw Error(std::string(what) + ": parameters can be stored as f32 or bf16, not " + std::string(dtype_name(dtype)));
}

// bf16 storage applies to matrices and kernels; biases and norm weights (1-D) stay f32, as the
// GEMM epilogue and the vector ops take them.
DType storage_dtype(const ParameterSpec& spec, DType dtype) { return spec.shape.size() >= 2 && !spec.keep_f32 ? dtype : DType::f32; }

}  // namespace

void ParameterTable::add(const std::string& name, Shape shape, Tensor* slot, bool keep_f32) {
  if (!names_.insert(name).second) throw Error("parameter '" + name + "' declared twice");
  specs_.push_back({name, std::move(shape), slot, keep_f32});
}

int64_t ParameterTable::numel() const {
  int64_t total = 0;
  for (const auto& s : specs_) total += shape_numel(s.shape);
  return total;
}

void ParameterTable::add_linear(const std::string& module_name, Linear* layer) {
  if (!linears_.emplace(module_name, layer).second) throw Error("Linear '" + module_name + "' is declared twice");
}

Linear& ParameterTable::linear(const std::string& module_name) const {
  const auto it = linears_.find(module_name);
  if (it != linears_.end()) return *it->second;
  // The nearest name sharing the longest prefix, to point at a typo.
  std::string best;
  std::size_t best_common = 0;
  for (const auto& [name, layer] : linears_) {
    const auto mismatch = std::mismatch(name.begin(), name.end(), module_name.begin(), module_name.end());
    const auto common = static_cast<std::size_t>(mismatch.first - name.begin());
    if (common > best_common) best_common = common, best = name;
  }
  throw Error("no Linear named '" + module_name + "' in this model (" + std::to_string(linears_.size()) + " Linears" +
              (best.empty() ? "" : "; the closest is '" + best + "'") + ")");
}

void require_finite_parameters(const ParameterTable& table, const std::string& component) {
  for (const ParameterSpec& spec : table.specs())
    if (spec.slot && spec.slot->defined()) require_finite(*spec.slot, component + ": weight '" + spec.name + "'");
}

void load_parameters(const ParameterTable& table, const Checkpoint& checkpoint, DType dtype) {
  load_parameters(table, checkpoint, dtype, LoadOptions{});
}

void load_parameters(const ParameterTable& table, const Checkpoint& checkpoint, DType dtype, const LoadOptions& options) {
  check_dtype(dtype, "load_parameters");
  std::vector<std::string> missing, misshaped, bad_dtype, unexpected;
  std::set<std::string> declared;
  for (const auto& spec : table.specs()) {
    declared.insert(spec.name);
    if (!checkpoint.contains(spec.name)) {
      missing.push_back(spec.name + " " + shape_to_string(spec.shape));
      continue;
    }
    const SafetensorsEntry& e = checkpoint.entry(spec.name);
    const Shape found(e.shape.begin(), e.shape.end());
    if (found != spec.shape) {
      misshaped.push_back(spec.name + ": expected " + shape_to_string(spec.shape) + ", found " + shape_to_string(found));
      continue;
    }
    const std::optional<DType> stored = e.dtype->dtype;
    if (!stored || (*stored != DType::f32 && *stored != DType::bf16 && *stored != DType::f16))
      bad_dtype.push_back(spec.name + ": " + std::string(e.dtype->name));
  }
  const auto reported = [&](const std::string& name) {
    if (std::find(options.ignored_names.begin(), options.ignored_names.end(), name) != options.ignored_names.end()) return false;
    if (options.unexpected_prefixes.empty()) return true;
    return std::any_of(options.unexpected_prefixes.begin(), options.unexpected_prefixes.end(),
                       [&](const std::string& prefix) { return name.compare(0, prefix.size(), prefix) == 0; });
  };
  for (const std::string& name : checkpoint.names())
    if (!declared.count(name) && reported(name)) unexpected.push_back(name);
  if (!missing.empty() || !misshaped.empty() || !bad_dtype.empty() || !unexpected.empty()) {
    std::ostringstream msg;
    msg << "checkpoint " << checkpoint.path() << " does not match the model (" << table.specs().size() << " parameters expected):";
    auto list = [&](const char* title, const std::vector<std::string>& items) {
      if (items.empty()) return;
      msg << "\n  " << items.size() << " " << title << ":";
      constexpr std::size_t kShown = 20;  // a config with 10,000 layers would list them all
      for (std::size_t i = 0; i < std::min(items.size(), kShown); ++i) msg << "\n    " << items[i];
      if (items.size() > kShown) msg << "\n    ... and " << items.size() - kShown << " more";
    };
    list("missing", missing);
    list("mis-shaped", misshaped);
    list("not a float dtype (f32, bf16 or f16)", bad_dtype);
    list("unexpected", unexpected);
    throw Error(msg.str());
  }
  for (const auto& spec : table.specs()) *spec.slot = converted(checkpoint.tensor(spec.name), storage_dtype(spec, dtype));
}

void make_meta_parameters(const ParameterTable& table, DType dtype) {
  check_dtype(dtype, "make_meta_parameters");
  for (const auto& spec : table.specs()) *spec.slot = Tensor::meta(spec.shape, storage_dtype(spec, dtype));
}

void make_random_parameters(const ParameterTable& table, DType dtype, uint64_t seed, float scale) {
  check_dtype(dtype, "make_random_parameters");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  for (const auto& spec : table.specs()) {
    std::vector<float> v(static_cast<std::size_t>(shape_numel(spec.shape)));
    for (float& x : v) x = dist(rng);
    *spec.slot = converted(Tensor::from_vector(v, spec.shape), storage_dtype(spec, dtype));
  }
}

}  // namespace cubevec::models
