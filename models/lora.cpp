#include "models/lora.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <map>
#include <set>

#include "base/error.h"
#include "models/layers.h"
#include "tensor/half.h"
#include "tensor/safetensors.h"

namespace cubevec::models {

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Tensor as_f32(const Tensor& t) {
  const Tensor c = t.contiguous();
  if (c.dtype() == DType::f32) return c;
  if (c.dtype() != DType::bf16 && c.dtype() != DType::f16) throw Error("expected a float tensor, got " + c.brief());
  Tensor out = Tensor::empty(c.shape(), DType::f32);
  const auto n = static_cast<std::size_t>(c.numel());
  if (c.dtype() == DType::bf16) convert_bf16_to_f32(c.data<uint16_t>(), out.mutable_data<float>(), n);
  else convert_f16_to_f32(c.data<uint16_t>(), out.mutable_data<float>(), n);
  return out;
}

}  // namespace

LoraAdapter read_lora(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  struct Parts {
    Tensor down, up;
    std::optional<double> alpha;
  };
  std::map<std::string, Parts> parts;
  std::set<std::string> seen;  // the keys without the prefix: each once
  for (const SafetensorsEntry& e : file.entries()) {
    std::string key = e.name;
    const bool prefixed = key.rfind("transformer.", 0) == 0;
    if (prefixed) key = key.substr(12);
    if (!seen.insert(key).second)
      throw Error(path + ": tensor '" + e.name + "' is given twice (with and without the 'transformer.' prefix)");
    std::string module;
    Tensor* slot = nullptr;
    if (ends_with(key, ".lora_A.weight")) module = key.substr(0, key.size() - 14), slot = &parts[module].down;
    else if (ends_with(key, ".lora_B.weight")) module = key.substr(0, key.size() - 14), slot = &parts[module].up;
    else if (ends_with(key, ".alpha")) module = key.substr(0, key.size() - 6);
    else throw Error(path + ": tensor '" + e.name + "' is not a LoRA weight (expected <module>.lora_A.weight, .lora_B.weight or .alpha)");
    Tensor t;
    try {
      t = as_f32(file.tensor(e.name));
    } catch (const Error& error) {
      throw Error(path + ": tensor '" + e.name + "': " + error.what());
    }
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(t.data<float>()[i])) throw Error(path + ": tensor '" + e.name + "' holds a non-finite value");
    if (slot) {
      if (t.dim() != 2 || t.size(0) < 1 || t.size(1) < 1)
        throw Error(path + ": tensor '" + e.name + "' must be 2-D with a rank of at least 1, got " + shape_to_string(t.shape()));
      *slot = t;
    } else {
      if (t.numel() != 1) throw Error(path + ": tensor '" + e.name + "' (an alpha) must hold one value, got " + shape_to_string(t.shape()));
      parts[module].alpha = t.data<float>()[0];
    }
  }
  LoraAdapter adapter{path, {}};
  for (const auto& [module, p] : parts) {
    if (!p.down.defined() || !p.up.defined())
      throw Error(path + ": layer '" + module + "' has " + (p.down.defined() ? "lora_A but no lora_B" : "no lora_A") + " weight");
    if (p.down.size(0) != p.up.size(1))
      throw Error(path + ": layer '" + module + "': lora_A " + shape_to_string(p.down.shape()) + " and lora_B " +
                  shape_to_string(p.up.shape()) + " have different ranks");
    adapter.layers.push_back({module, p.down, p.up, p.alpha.value_or(static_cast<double>(p.down.size(0)))});
  }
  if (adapter.layers.empty()) throw Error(path + ": no LoRA layers (no lora_A / lora_B weights)");
  return adapter;
}

int fuse_lora(const ParameterTable& table, const LoraAdapter& adapter, double scale, bool ignore_unmatched, int* unmatched) {
  if (!std::isfinite(scale)) throw Error("--lora " + adapter.path + ": the scale must be finite");
  std::vector<std::string> missing;
  for (const LoraLayer& l : adapter.layers)
    if (!table.linears().count(l.module)) missing.push_back(l.module);
  if (!missing.empty() && !ignore_unmatched) {
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
    throw Error("--lora " + adapter.path + ": " + std::to_string(missing.size()) + " of its " + std::to_string(adapter.layers.size()) +
                " layers match no layer of the model (" + list + (missing.size() > 5 ? ", ..." : "") +
                "); --lora-ignore-unmatched skips them");
  }
  if (unmatched) *unmatched = static_cast<int>(missing.size());
  if (missing.size() == adapter.layers.size())
    throw Error("--lora " + adapter.path + ": none of its " + std::to_string(adapter.layers.size()) +
                " layers match a layer of the model (first: " + missing.front() + "); is it a LoRA for this model?");
  int fused = 0;
  for (const LoraLayer& l : adapter.layers) {
    const auto it = table.linears().find(l.module);
    if (it == table.linears().end()) continue;
    Linear& layer = *it->second;
    const int64_t rank = l.down.size(0);
    if (l.down.size(1) != layer.in || l.up.size(0) != layer.out)
      throw Error("--lora " + adapter.path + ": layer '" + l.module + "' is [" + std::to_string(layer.out) + ", " +
                  std::to_string(layer.in) + "], but its LoRA makes [" + std::to_string(l.up.size(0)) + ", " +
                  std::to_string(l.down.size(1)) + "]");
    const Tensor w = as_f32(layer.weight);
    Tensor fused_weight = Tensor::empty(w.shape(), DType::f32);
    const float *pw = w.data<float>(), *a = l.down.data<float>(), *b = l.up.data<float>();
    float* out = fused_weight.mutable_data<float>();
    const double factor = scale * l.alpha / static_cast<double>(rank);
    for (int64_t o = 0; o < layer.out; ++o)
      for (int64_t i = 0; i < layer.in; ++i) {
        double delta = 0;
        for (int64_t r = 0; r < rank; ++r) delta += static_cast<double>(b[o * rank + r]) * a[r * layer.in + i];
        out[o * layer.in + i] = static_cast<float>(pw[o * layer.in + i] + factor * delta);
        if (!std::isfinite(out[o * layer.in + i]))
          throw Error("--lora " + adapter.path + ": layer '" + l.module + "' overflows when fused at scale " + number_for_message(scale) +
                      " (a weight becomes infinite)");
      }
    if (layer.weight.dtype() == DType::bf16) {
      Tensor rounded = Tensor::empty(w.shape(), DType::bf16);
      convert_f32_to_bf16(out, rounded.mutable_data<uint16_t>(), static_cast<std::size_t>(w.numel()));
      fused_weight = rounded;
    }
    layer.weight = fused_weight;  // a new tensor: the layer packs it again on its next use
    ++fused;
  }
  return fused;
}

std::pair<std::string, double> parse_lora_flag(const std::string& text) {
  const std::size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size()) return {text, 1.0};
  const std::string number = text.substr(colon + 1);
  char* end = nullptr;
  errno = 0;
  const double scale = std::strtod(number.c_str(), &end);
  // Not a number (or one with spaces): the ':' belongs to the path (a path ending in ":NUMBER" needs
  // its scale given, "a:2:1").
  if (end == number.c_str() || *end != '\0' || std::isspace(static_cast<unsigned char>(number.front()))) return {text, 1.0};
  if (!std::isfinite(scale) || (errno == ERANGE && scale == 0 && number.find_first_of("123456789") != std::string::npos))
    throw Error("--lora " + text + ": the scale must be a finite number, got " + number);
  return {text.substr(0, colon), scale};
}

}  // namespace cubevec::models
