#include "quant/files.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "base/error.h"
#include "tensor/half.h"
#include "base/strict_json.h"
#include "base/output_file.h"

namespace cubevec::quant {

namespace fs = std::filesystem;

namespace {

const std::array<std::string, 10> kSuffixes = {".weight",    ".weight_scale", ".weight_offset", ".input_scale", ".input_offset",
                                               ".deq_scale", ".quant_bias",   ".bias",          ".fa_q.scale",  ".quant_type"};

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
// A name or value from a file, shortened for an error message.
std::string clipped(const std::string& s) { return s.size() <= 120 ? s : s.substr(0, 117) + "..."; }

// Any float tensor (f32, bf16, f16) or, for deq_scale, i64 holding f32 bits, as f32 of `shape`
// (size-1 dims of the file's shape dropped to fit: [O, 1] -> [O]).
Tensor as_f32(const Tensor& t, const Shape& shape, bool allow_i64_bits, const std::string& what) {
  if (shape_numel(shape) != t.numel())
    throw Error(what + " must have " + std::to_string(shape_numel(shape)) + " values (" + shape_to_string(shape) + "), got " +
                shape_to_string(t.shape()));
  const Tensor c = t.contiguous();
  std::vector<float> v(static_cast<std::size_t>(c.numel()));
  switch (c.dtype()) {
    case DType::f32: std::copy_n(c.data<float>(), v.size(), v.begin()); break;
    case DType::bf16: convert_bf16_to_f32(c.data<uint16_t>(), v.data(), v.size()); break;
    case DType::f16: convert_f16_to_f32(c.data<uint16_t>(), v.data(), v.size()); break;
    case DType::i64:
      if (!allow_i64_bits) throw Error(what + " must be a float tensor, got i64");
      for (std::size_t i = 0; i < v.size(); ++i) {  // the f32 bit pattern in the low 32 bits
        const auto bits = static_cast<uint32_t>(static_cast<uint64_t>(c.data<int64_t>()[i]) & 0xffffffffu);
        std::memcpy(&v[i], &bits, 4);
      }
      break;
    default:
      throw Error(what + " must be f32, bf16 or f16" + std::string(allow_i64_bits ? " (or i64 bit patterns)" : "") + ", got " +
                  std::string(dtype_name(c.dtype())));
  }
  return Tensor::from_vector(v, shape);
}

}  // namespace

Description Description::load(const std::string& path) {
  const nlohmann::json json = read_json_file(path, 4);
  if (!json.is_object()) throw Error(path + ": expected a JSON object (a MindIE SD quant description)");
  Description d;
  d.path = path;
  if (!json.contains("model_quant_type"))
    throw Error(path + ": missing 'model_quant_type' (the string naming the file's algorithm, e.g. \"W8A8_DYNAMIC\")");
  if (!json["model_quant_type"].is_string())
    throw Error(path + ": 'model_quant_type' must be a string naming the file's algorithm (e.g. \"W8A8_DYNAMIC\"), got " +
                clipped(json["model_quant_type"].dump()));
  d.model_quant_type = json["model_quant_type"].get<std::string>();
  // MindIE SD reads this one without upper-casing: it must be an algorithm name exactly.
  if (!is_mindie_algorithm(d.model_quant_type) || upper(d.model_quant_type) != d.model_quant_type)
    throw Error(path + ": 'model_quant_type' \"" + d.model_quant_type +
                "\" is not one of MindIE SD's algorithm names (exact case, e.g. \"W8A8\")");
  for (const auto& [key, value] : json.items()) {
    if (key == "model_quant_type") continue;
    // A tensor's entry must say FLOAT or an algorithm; other keys (metadata) are not read.
    const std::string& name = key;  // clang cannot capture a structured binding
    const bool tensor_key = name.ends_with(".div.mul_scale") ||
                            std::any_of(kSuffixes.begin(), kSuffixes.end(), [&](const std::string& s) { return name.ends_with(s); });
    if (tensor_key && !value.is_string())
      throw Error(path + ": '" + clipped(key) + "' must be a string (FLOAT or an algorithm name), got " + clipped(value.dump()));
    if (!value.is_string()) continue;
    const std::string text = value.get<std::string>();
    if (tensor_key && text != "FLOAT" && !is_mindie_algorithm(text))
      throw Error(path + ": '" + clipped(key) + "' is \"" + clipped(text) + "\", neither FLOAT nor one of MindIE SD's algorithm names");
    d.entries[key] = text;
  }
  return d;
}

std::string Description::weight_path() const {
  const fs::path p(path);
  std::string stem = p.stem().string(), rank;
  const auto underscore = stem.rfind('_');
  if (underscore != std::string::npos && underscore + 1 < stem.size() &&
      std::all_of(stem.begin() + static_cast<std::ptrdiff_t>(underscore) + 1, stem.end(), [](unsigned char c) { return std::isdigit(c); }))
    rank = stem.substr(underscore);
  return (p.parent_path() / ("quant_model_weight_" + lower(model_quant_type) + rank + ".safetensors")).string();
}

std::optional<std::string> Description::algorithm_value(const std::string& module) const {
  const std::array<std::string, 5> patterns = {module + ".linear.weight", module + ".weight", module, module + ".fa_q.scale",
                                               module + ".quant_type"};
  for (const std::string& key : patterns)  // exclusions first, exact "FLOAT" as MindIE SD compares
    if (const auto it = entries.find(key); it != entries.end() && it->second == "FLOAT") return std::nullopt;
  for (const std::string& key : patterns)
    if (const auto it = entries.find(key); it != entries.end() && is_mindie_algorithm(it->second)) return it->second;
  return std::nullopt;
}

std::vector<std::string> Description::quantized_modules() const {
  std::set<std::string> modules;
  for (const auto& [key, value] : entries) {
    if (value == "FLOAT" || !is_mindie_algorithm(value)) continue;
    std::string module = key;
    for (const std::string& suffix : kSuffixes)
      if (module.size() > suffix.size() && module.ends_with(suffix)) {
        module.resize(module.size() - suffix.size());
        break;
      }
    // "<X>.linear.*" is the SmoothQuant layout only when "<X>.div.mul_scale" exists; otherwise
    // ".linear" is part of the module's own name (Flux's norm_out.linear).
    if (module.ends_with(".linear") && entries.count(module.substr(0, module.size() - 7) + ".div.mul_scale"))
      module.resize(module.size() - 7);
    modules.insert(module);
  }
  return {modules.begin(), modules.end()};
}

QuantTensors read_layer_tensors(const SafetensorsFile& weights, const std::string& module, Algorithm algorithm, bool has_bias) {
  const std::string& file = weights.path();
  const std::string prefix = weights.contains(module + ".div.mul_scale") ? module + ".linear" : module;
  const auto get = [&](const std::string& suffix, bool required) -> Tensor {
    const std::string key = prefix + suffix;
    if (weights.contains(key)) return weights.tensor(key);
    if (required)
      throw Error(file + ": layer '" + module + "' (" + std::string(algorithm_name(algorithm)) + ") has no tensor '" + key + "'");
    return {};
  };
  const auto what = [&](const std::string& suffix) { return file + ": '" + prefix + suffix + "'"; };
  QuantTensors t;
  t.weight = get(".weight", true);
  if (t.weight.dtype() != DType::i8 || t.weight.dim() != 2)
    throw Error(what(".weight") + " must be i8 [out, in], got " + std::string(dtype_name(t.weight.dtype())) + " " +
                shape_to_string(t.weight.shape()));
  const int64_t out = t.weight.size(0), in = t.weight.size(1);
  if (weights.contains(module + ".div.mul_scale"))
    t.mul_scale = as_f32(weights.tensor(module + ".div.mul_scale"), {in}, false, file + ": '" + module + ".div.mul_scale'");
  const bool dynamic = algorithm != Algorithm::w8a8;
  if (dynamic) t.weight_scale = as_f32(get(".weight_scale", true), {out}, false, what(".weight_scale"));
  if (const Tensor offset = get(".weight_offset", false); offset.defined()) {
    // Symmetric weights only: MindIE SD's kernels apply no weight offset, so a non-zero one would be silently wrong.
    const Tensor o = as_f32(offset, {out}, false, what(".weight_offset"));
    for (int64_t i = 0; i < out; ++i)
      if (o.data<float>()[i] != 0.0f)
        throw Error(what(".weight_offset") + " must be zero (symmetric int8 weights; no weight offset is applied), channel " +
                    std::to_string(i) + " holds " + std::to_string(o.data<float>()[i]));
  }
  if (has_bias && algorithm != Algorithm::w8a8) {
    const Tensor bias = get(".bias", true);  // MindIE SD reads it whenever the float layer has one
    t.bias = as_f32(bias, {out}, false, what(".bias"));
  }
  if (algorithm == Algorithm::w8a8 || algorithm == Algorithm::w8a8_timestep) {
    const Tensor scale = get(".input_scale", true);
    const int64_t steps = algorithm == Algorithm::w8a8_timestep ? (scale.dim() >= 1 ? scale.size(0) : 1) : 1;
    const Shape vec = algorithm == Algorithm::w8a8_timestep ? Shape{steps} : Shape{1};
    const Shape mat = algorithm == Algorithm::w8a8_timestep ? Shape{steps, out} : Shape{out};
    t.input_scale = as_f32(scale, vec, false, what(".input_scale"));
    t.input_offset = as_f32(get(".input_offset", true), vec, false, what(".input_offset"));
    t.deq_scale = as_f32(get(".deq_scale", true), mat, true, what(".deq_scale"));
    t.quant_bias = get(".quant_bias", true);
    if (t.quant_bias.dtype() != DType::i32 || t.quant_bias.numel() != shape_numel(mat))
      throw Error(what(".quant_bias") + " must be i32 " + shape_to_string(mat) + ", got " + std::string(dtype_name(t.quant_bias.dtype())) +
                  " " + shape_to_string(t.quant_bias.shape()));
    t.quant_bias = t.quant_bias.contiguous().reshape(mat);
    // The GEMM's int32 sums reach 128 x 128 per input (u8 - 128 times s8): a bias past what is left
    // would wrap them, silently.
    const int64_t headroom = std::max<int64_t>(0, int64_t{INT32_MAX} - int64_t{128} * 128 * in);
    const int32_t* qb = t.quant_bias.data<int32_t>();
    for (int64_t i = 0; i < t.quant_bias.numel(); ++i)
      if (std::abs(static_cast<int64_t>(qb[i])) > headroom)
        throw Error(what(".quant_bias") + " element " + std::to_string(i) + " is " + std::to_string(qb[i]) + ": beyond +-" +
                    std::to_string(headroom) + " it would overflow the int32 sums of a " + std::to_string(in) + "-input layer");
  }
  return t;
}

void Writer::add_float(const std::string& name, const Tensor& value) {
  description[name] = "FLOAT";
  tensors.push_back({name, value});
}

void Writer::add_layer(const std::string& module, Algorithm algorithm, const QuantTensors& t) {
  const std::string algo_name(algorithm_name(algorithm));
  std::string prefix = module;
  if (t.mul_scale.defined()) {
    add_float(module + ".div.mul_scale", t.mul_scale);
    prefix = module + ".linear";
  }
  const auto put = [&](const std::string& suffix, const Tensor& value) {
    description[prefix + suffix] = algo_name;
    tensors.push_back({prefix + suffix, value});
  };
  const int64_t out = t.weight.size(0);
  put(".weight", t.weight);
  if (algorithm != Algorithm::w8a8) {
    put(".weight_scale", t.weight_scale.reshape({out, 1}));
    put(".weight_offset", Tensor::zeros({out, 1}, DType::f32));
  }
  if (algorithm == Algorithm::w8a8 || algorithm == Algorithm::w8a8_timestep) {
    const bool stacked = algorithm == Algorithm::w8a8_timestep;
    const int64_t steps = t.input_scale.size(0);
    put(".quant_bias", t.quant_bias);
    put(".input_scale", stacked ? t.input_scale.reshape({steps, 1}) : t.input_scale);
    put(".input_offset", stacked ? t.input_offset.reshape({steps, 1}) : t.input_offset);
    if (deq_scale_int64) {
      const Tensor d = t.deq_scale.contiguous();
      std::vector<int64_t> bits(static_cast<std::size_t>(d.numel()));
      for (std::size_t i = 0; i < bits.size(); ++i) {
        int32_t b;
        std::memcpy(&b, d.data<float>() + i, 4);
        bits[i] = b;  // sign-extended, as msModelSlim writes it
      }
      put(".deq_scale", Tensor::from_vector(bits, d.shape()));
    } else {
      put(".deq_scale", t.deq_scale);
    }
  }
  if (t.bias.defined()) add_float(prefix + ".bias", t.bias);
}

std::string description_file(const std::string& dir, const std::string& algo) {
  return dir + "/quant_model_description_" + lower(algo) + ".json";
}

std::string weight_file(const std::string& dir, const std::string& algo) {
  return dir + "/quant_model_weight_" + lower(algo) + ".safetensors";
}

void Writer::save(const std::string& dir) const {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) throw Error(dir + ": cannot create the output directory" + (ec ? " (" + ec.message() + ")" : ""));
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  json["model_quant_type"] = algo;
  for (const auto& [key, value] : description.items()) json[key] = value;
  // Both files are written to temporaries beside their final names, then renamed: a failure leaves
  // the previous pair as it was, never a new description over old weights.
  const std::string description_path = description_file(dir, algo), weight_path = weight_file(dir, algo);
  OutputFile description_file(description_path, "quantization description"), weight_file(weight_path, "quantization weights");
  description_file.write(json.dump(2) + "\n");
  write_safetensors(weight_file, tensors);
  description_file.close();
  weight_file.commit();
  description_file.commit();
}

}  // namespace cubevec::quant
