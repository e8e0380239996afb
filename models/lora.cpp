#include "models/lora.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <algorithm>
#include <map>
#include <optional>
#include <regex>
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

// --- the formats' names ---------------------------------------------------------------------------

struct Mapped {
  std::vector<std::string> modules;
  bool swap_halves = false;
};

// kohya / sd-scripts' Flux names (after "lora_unet_"), as diffusers' _convert_kohya_flux_lora_to_diffusers.
std::optional<Mapped> kohya_flux_modules(const std::string& name) {
  static const std::regex double_block(R"(double_blocks_(\d+)_(\w+))"), single_block(R"(single_blocks_(\d+)_(\w+))");
  static const std::map<std::string, std::vector<std::string>> double_parts = {
      {"img_attn_proj", {"attn.to_out.0"}},
      {"img_attn_qkv", {"attn.to_q", "attn.to_k", "attn.to_v"}},
      {"img_mlp_0", {"ff.net.0.proj"}},
      {"img_mlp_2", {"ff.net.2"}},
      {"img_mod_lin", {"norm1.linear"}},
      {"txt_attn_proj", {"attn.to_add_out"}},
      {"txt_attn_qkv", {"attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"}},
      {"txt_mlp_0", {"ff_context.net.0.proj"}},
      {"txt_mlp_2", {"ff_context.net.2"}},
      {"txt_mod_lin", {"norm1_context.linear"}},
  };
  static const std::map<std::string, std::vector<std::string>> single_parts = {
      {"linear1", {"attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"}},
      {"linear2", {"proj_out"}},
      {"modulation_lin", {"norm.linear"}},
  };
  static const std::map<std::string, std::string> global = {
      {"img_in", "x_embedder"},
      {"txt_in", "context_embedder"},
      {"time_in_in_layer", "time_text_embed.timestep_embedder.linear_1"},
      {"time_in_out_layer", "time_text_embed.timestep_embedder.linear_2"},
      {"vector_in_in_layer", "time_text_embed.text_embedder.linear_1"},
      {"vector_in_out_layer", "time_text_embed.text_embedder.linear_2"},
      {"guidance_in_in_layer", "time_text_embed.guidance_embedder.linear_1"},
      {"guidance_in_out_layer", "time_text_embed.guidance_embedder.linear_2"},
      {"final_layer_linear", "proj_out"},
      {"final_layer_adaLN_modulation_1", "norm_out.linear"},
  };
  std::smatch m;
  const auto block = [&](const std::map<std::string, std::vector<std::string>>& parts, const std::string& prefix) -> std::optional<Mapped> {
    const auto it = parts.find(m[2].str());
    if (it == parts.end()) return std::nullopt;
    Mapped out;
    for (const std::string& part : it->second) out.modules.push_back(prefix + m[1].str() + "." + part);
    return out;
  };
  if (std::regex_match(name, m, double_block)) return block(double_parts, "transformer_blocks.");
  if (std::regex_match(name, m, single_block)) return block(single_parts, "single_transformer_blocks.");
  const auto it = global.find(name);
  if (it == global.end()) return std::nullopt;
  // BFL's final adaLN projects to (shift, scale); diffusers' AdaLayerNormContinuous to (scale, shift).
  return Mapped{{it->second}, name == "final_layer_adaLN_modulation_1"};
}

// Wan's attention and feed-forward names, original ("self_attn", "q", "ffn", "0") or musubi's, to
// diffusers' (diffusers' _convert_non_diffusers_wan_lora_to_diffusers and _convert_musubi_...).
std::optional<std::string> wan_block_module(const std::string& block, const std::string& group, const std::string& part) {
  static const std::map<std::string, std::string> attention = {{"q", "to_q"},     {"k", "to_k"},           {"v", "to_v"},
                                                               {"o", "to_out.0"}, {"k_img", "add_k_proj"}, {"v_img", "add_v_proj"}};
  if (group == "ffn") {
    if (part == "0") return "blocks." + block + ".ffn.net.0.proj";
    if (part == "2") return "blocks." + block + ".ffn.net.2";
    return std::nullopt;
  }
  const auto it = attention.find(part);
  if (it == attention.end() || (group == "self_attn" && part.find("img") != std::string::npos)) return std::nullopt;
  return "blocks." + block + (group == "self_attn" ? ".attn1." : ".attn2.") + it->second;
}

std::optional<std::string> wan_original_module(const std::string& name) {
  static const std::regex attention(R"(blocks\.(\d+)\.(self_attn|cross_attn)\.(\w+))"), ffn(R"(blocks\.(\d+)\.ffn\.(\d+))");
  static const std::map<std::string, std::string> global = {
      {"time_projection.1", "condition_embedder.time_proj"},
      {"head.head", "proj_out"},
      {"text_embedding.0", "condition_embedder.text_embedder.linear_1"},
      {"text_embedding.2", "condition_embedder.text_embedder.linear_2"},
      {"time_embedding.0", "condition_embedder.time_embedder.linear_1"},
      {"time_embedding.2", "condition_embedder.time_embedder.linear_2"},
      {"img_emb.proj.1", "condition_embedder.image_embedder.ff.net.0.proj"},
      {"img_emb.proj.3", "condition_embedder.image_embedder.ff.net.2"},
  };
  std::smatch m;
  if (std::regex_match(name, m, attention)) return wan_block_module(m[1].str(), m[2].str(), m[3].str());
  if (std::regex_match(name, m, ffn)) return wan_block_module(m[1].str(), "ffn", m[2].str());
  const auto it = global.find(name);
  return it == global.end() ? std::nullopt : std::optional<std::string>(it->second);
}

std::optional<std::string> musubi_wan_module(const std::string& name) {
  static const std::regex attention(R"(blocks_(\d+)_(self_attn|cross_attn)_(\w+))"), ffn(R"(blocks_(\d+)_ffn_(\d+))");
  std::smatch m;
  if (std::regex_match(name, m, attention)) return wan_block_module(m[1].str(), m[2].str(), m[3].str());
  if (std::regex_match(name, m, ffn)) return wan_block_module(m[1].str(), "ffn", m[2].str());
  return std::nullopt;
}

// One key split into its format, the layer's name in the file and the part it holds.
enum class Part { down, up, alpha, bias, full_diff };
struct Key {
  std::string format, layer;
  Part part = Part::down;
};

std::optional<Key> split_key(const std::string& key) {
  const auto strip = [&](const std::string& text, const std::vector<std::pair<std::string, Part>>& suffixes) -> std::optional<Key> {
    for (const auto& [suffix, part] : suffixes)
      if (ends_with(text, suffix)) return Key{"", text.substr(0, text.size() - suffix.size()), part};
    return std::nullopt;
  };
  if (key.rfind("lora_unet_", 0) == 0 || key.rfind("lora_te", 0) == 0) {
    std::optional<Key> k = strip(key, {{".lora_down.weight", Part::down}, {".lora_up.weight", Part::up}, {".alpha", Part::alpha}});
    if (k) k->format = key.rfind("lora_unet_blocks_", 0) == 0 ? "musubi-wan" : "kohya-flux";
    return k;
  }
  if (key.rfind("diffusion_model.", 0) == 0) {
    std::optional<Key> k = strip(key.substr(16), {{".lora_A.weight", Part::down},
                                                  {".lora_B.weight", Part::up},
                                                  {".lora_down.weight", Part::down},
                                                  {".lora_up.weight", Part::up},
                                                  {".alpha", Part::alpha},
                                                  {".diff_b", Part::bias},
                                                  {".diff", Part::full_diff}});
    if (k) k->format = "wan";
    return k;
  }
  std::optional<Key> k = strip(key.rfind("transformer.", 0) == 0 ? key.substr(12) : key,
                               {{".lora_A.weight", Part::down}, {".lora_B.weight", Part::up}, {".alpha", Part::alpha}});
  if (k) k->format = "diffusers";
  return k;
}

// The modules a layer of `format` named `layer` changes; its own name when cubevec knows no such
// module (it is then listed as unmatched).
Mapped modules_of(const std::string& format, const std::string& layer) {
  if (format == "kohya-flux" && layer.rfind("lora_unet_", 0) == 0)
    if (std::optional<Mapped> m = kohya_flux_modules(layer.substr(10))) return *m;
  if (format == "musubi-wan")
    if (std::optional<std::string> m = musubi_wan_module(layer.substr(10))) return {{*m}};
  if (format == "wan")
    if (std::optional<std::string> m = wan_original_module(layer)) return {{*m}};
  if (format == "diffusers") return {{layer}};
  return {{layer}};
}

}  // namespace

LoraAdapter read_lora(const std::string& path) {
  const SafetensorsFile file = SafetensorsFile::open(path);
  struct Parts {
    Tensor down, up, bias;
    std::optional<double> alpha;
    bool full_diff = false;
  };
  std::map<std::string, Parts> parts;
  std::set<std::string> seen;  // the keys without the prefix: each once
  std::string format, first_key;
  for (const SafetensorsEntry& e : file.entries()) {
    const std::optional<Key> key = split_key(e.name);
    if (!key)
      throw Error(path + ": tensor '" + e.name +
                  "' is not a LoRA weight (expected <module>.lora_A.weight, .lora_B.weight or .alpha (diffusers), "
                  "lora_unet_<layer>.lora_down.weight, .lora_up.weight or .alpha (kohya), or diffusion_model.<module>.* (Wan))");
    if (format.empty()) format = key->format, first_key = e.name;
    if (key->format != format)
      throw Error(path + ": tensor '" + e.name + "' is in " + key->format + " form but '" + first_key + "' is in " + format +
                  " form; one file holds one LoRA format");
    const std::string unique = key->layer + "#" + std::to_string(static_cast<int>(key->part));
    if (!seen.insert(unique).second)
      throw Error(path + ": tensor '" + e.name + "' is given twice (the same layer's " +
                  (key->part == Part::down ? "A"
                   : key->part == Part::up ? "B"
                                           : "part") +
                  " under two names: with and without a prefix, or as lora_A and lora_down)");
    Tensor t;
    try {
      t = as_f32(file.tensor(e.name));
    } catch (const Error& error) {
      throw Error(path + ": tensor '" + e.name + "': " + error.what());
    }
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(t.data<float>()[i])) throw Error(path + ": tensor '" + e.name + "' holds a non-finite value");
    // Wan's norm diffs (checked like any tensor) are dropped, as diffusers drops them: they hold zeros.
    if (format == "wan" && (key->part == Part::bias || key->part == Part::full_diff) && key->layer.find("norm") != std::string::npos)
      continue;
    Parts& p = parts[key->layer];
    switch (key->part) {
      case Part::down:
      case Part::up:
        if (t.dim() != 2 || t.size(0) < 1 || t.size(1) < 1)
          throw Error(path + ": tensor '" + e.name + "' must be 2-D with a rank of at least 1, got " + shape_to_string(t.shape()));
        (key->part == Part::down ? p.down : p.up) = t;
        break;
      case Part::alpha:
        if (t.numel() != 1)
          throw Error(path + ": tensor '" + e.name + "' (an alpha) must hold one value, got " + shape_to_string(t.shape()));
        p.alpha = t.data<float>()[0];
        break;
      case Part::bias:
        if (t.dim() != 1)
          throw Error(path + ": tensor '" + e.name + "' (a bias difference) must be 1-D, got " + shape_to_string(t.shape()));
        p.bias = t;
        break;
      case Part::full_diff: p.full_diff = true; break;
    }
  }
  LoraAdapter adapter{path, format, {}};
  for (const auto& [name, p] : parts) {
    LoraLayer layer;
    layer.name = name;
    if (p.full_diff) {
      // A whole weight difference, which cubevec does not apply (diffusers ignores it too): listed as
      // unmatched under a name that says so; a LoRA of the same layer is still read below.
      LoraLayer diff;
      diff.name = name + ".diff (a whole weight difference, not applied)";
      diff.modules = {diff.name};
      adapter.layers.push_back(diff);
      if (!p.down.defined() && !p.up.defined() && !p.bias.defined()) continue;
    }
    if (p.down.defined() != p.up.defined() || (!p.down.defined() && !p.bias.defined()))
      throw Error(path + ": layer '" + name + "' has " + (p.down.defined() ? "lora_A but no lora_B" : "no lora_A") + " weight");
    if (p.down.defined() && p.down.size(0) != p.up.size(1))
      throw Error(path + ": layer '" + name + "': lora_A " + shape_to_string(p.down.shape()) + " and lora_B " +
                  shape_to_string(p.up.shape()) + " have different ranks");
    const Mapped mapped = modules_of(format, name);
    layer.modules = mapped.modules;
    layer.swap_halves = mapped.swap_halves;
    layer.down = p.down;
    layer.up = p.up;
    layer.bias = p.bias;
    layer.alpha = p.alpha.value_or(p.down.defined() ? static_cast<double>(p.down.size(0)) : 1.0);
    adapter.layers.push_back(layer);
  }
  if (adapter.layers.empty()) throw Error(path + ": no LoRA layers (no lora_A / lora_B weights)");
  return adapter;
}

std::vector<LoraDelta> resolve_lora(const ParameterTable& table, const LoraAdapter& adapter, double scale, bool ignore_unmatched,
                                    int* unmatched) {
  if (!std::isfinite(scale)) throw Error("--lora " + adapter.path + ": the scale must be finite");
  // A file in one family's names maps a few of its layers onto modules the other family has too
  // (kohya's final_layer_linear and Wan's head.head are both proj_out): name the mismatch instead.
  const bool flux_names = adapter.format == "kohya-flux", wan_names = adapter.format == "wan" || adapter.format == "musubi-wan";
  if ((flux_names && !table.linears().count("x_embedder")) || (wan_names && !table.linears().count("condition_embedder.time_proj")))
    throw Error("--lora " + adapter.path + ": a LoRA in " + adapter.format + " names is for a " + (flux_names ? "Flux" : "Wan") +
                " transformer, and this model is not one");
  const auto has_all = [&](const LoraLayer& l) {
    return std::all_of(l.modules.begin(), l.modules.end(), [&](const std::string& m) { return table.linears().count(m) > 0; });
  };
  std::vector<std::string> missing;
  for (const LoraLayer& l : adapter.layers)
    if (!has_all(l)) missing.push_back(l.name);
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
  std::vector<LoraDelta> deltas;
  for (const LoraLayer& l : adapter.layers) {
    if (!has_all(l)) continue;
    std::vector<Linear*> layers;
    int64_t rows = 0;
    for (const std::string& m : l.modules) {
      layers.push_back(table.linears().at(m));
      rows += layers.back()->out;
    }
    const auto makes = [&](int64_t out, int64_t in) {
      std::string parts;
      for (const Linear* layer : layers)
        parts += (parts.empty() ? "" : " + ") + std::string("[") + std::to_string(layer->out) + ", " + std::to_string(layer->in) + "]";
      return "--lora " + adapter.path + ": layer '" + l.name + "' is " + parts + ", but its LoRA makes [" + std::to_string(out) + ", " +
             std::to_string(in) + "]";
    };
    if (l.down.defined())
      for (const Linear* layer : layers)
        if (l.down.size(1) != layer->in || l.up.size(0) != rows) throw Error(makes(l.up.size(0), l.down.size(1)));
    if (l.bias.defined() && l.bias.size(0) != rows)
      throw Error("--lora " + adapter.path + ": layer '" + l.name + "' has " + std::to_string(rows) + " outputs, but its bias difference " +
                  std::to_string(l.bias.size(0)));
    // B (and the bias) in the model's row order: kohya's final adaLN swapped, then split over the parts.
    const auto reorder = [&](const Tensor& t) {
      if (!t.defined() || !l.swap_halves) return t;
      const int64_t half = t.size(0) / 2;
      Tensor swapped = Tensor::empty(t.shape(), DType::f32);
      const int64_t row = t.numel() / t.size(0);
      const float* src = t.data<float>();
      float* dst = swapped.mutable_data<float>();
      std::copy(src + half * row, src + 2 * half * row, dst);
      std::copy(src, src + half * row, dst + half * row);
      return swapped;
    };
    const Tensor up = reorder(l.up), bias = reorder(l.bias);
    int64_t first = 0;
    for (std::size_t i = 0; i < layers.size(); ++i) {
      LoraDelta d;
      d.module = l.modules[i];
      d.layer = layers[i];
      if (l.down.defined()) {
        d.down = l.down;
        d.up = up.narrow(0, first, layers[i]->out).contiguous();
        d.factor = scale * l.alpha / static_cast<double>(l.down.size(0));
      }
      if (bias.defined()) {
        if (!layers[i]->bias.defined())
          throw Error("--lora " + adapter.path + ": layer '" + l.name + "' has a bias difference, but '" + d.module + "' has no bias");
        d.bias = bias.narrow(0, first, layers[i]->out).contiguous();
        d.bias_factor = scale;
      }
      first += layers[i]->out;
      deltas.push_back(std::move(d));
    }
  }
  return deltas;
}

namespace {

// `values` (f32) stored as `like`'s dtype (f32 or bf16), or an error when a value overflowed.
Tensor store_like(const Tensor& like, Tensor values) {
  if (like.dtype() != DType::bf16) return values;
  Tensor rounded = Tensor::empty(values.shape(), DType::bf16);
  convert_f32_to_bf16(values.data<float>(), rounded.mutable_data<uint16_t>(), static_cast<std::size_t>(values.numel()));
  return rounded;
}

}  // namespace

int fuse_lora(const ParameterTable& table, const LoraAdapter& adapter, double scale, bool ignore_unmatched, int* unmatched) {
  const std::vector<LoraDelta> deltas = resolve_lora(table, adapter, scale, ignore_unmatched, unmatched);
  const auto overflow = [&](const LoraDelta& d) {
    return Error("--lora " + adapter.path + ": layer '" + d.module + "' overflows when fused at scale " + number_for_message(scale) +
                 " (a weight becomes infinite)");
  };
  for (const LoraDelta& d : deltas) {
    Linear& layer = *d.layer;
    if (d.down.defined()) {
      const int64_t rank = d.down.size(0);
      const Tensor w = as_f32(layer.weight);
      Tensor fused = Tensor::empty(w.shape(), DType::f32);
      const float *pw = w.data<float>(), *a = d.down.data<float>(), *b = d.up.data<float>();
      float* out = fused.mutable_data<float>();
      for (int64_t o = 0; o < layer.out; ++o)
        for (int64_t i = 0; i < layer.in; ++i) {
          double delta = 0;
          for (int64_t r = 0; r < rank; ++r) delta += static_cast<double>(b[o * rank + r]) * a[r * layer.in + i];
          out[o * layer.in + i] = static_cast<float>(pw[o * layer.in + i] + d.factor * delta);
          if (!std::isfinite(out[o * layer.in + i])) throw overflow(d);
        }
      layer.weight = store_like(layer.weight, fused);  // a new tensor: the layer packs it again on its next use
    }
    if (d.bias.defined()) {
      const Tensor b = as_f32(layer.bias);
      Tensor fused = Tensor::empty(b.shape(), DType::f32);
      for (int64_t o = 0; o < layer.out; ++o) {
        fused.mutable_data<float>()[o] = static_cast<float>(b.data<float>()[o] + d.bias_factor * d.bias.data<float>()[o]);
        if (!std::isfinite(fused.data<float>()[o])) throw overflow(d);
      }
      layer.bias = store_like(layer.bias, fused);
    }
  }
  return static_cast<int>(deltas.size());
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
