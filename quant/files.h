// MindIE SD's quantization files (the format msModelSlim writes; docs/stages.md, "MindIE SD's
// quantization files and schemes"):
//   quant_model_description_{algo}[_{rank}].json   a flat map: "model_quant_type": "<ALGO>", then one
//       entry per tensor name ("<module>.weight": "W8A8", "<module>.bias": "FLOAT", ...);
//   quant_model_weight_{algo}[_{rank}].safetensors beside it, with the quantized layers' tensors
//       (<module>.weight i8 [out, in], .weight_scale [out] or [out, 1], .weight_offset, .input_scale,
//       .input_offset, .deq_scale (f32, bf16, or i64 holding the f32 bit pattern), .quant_bias i32,
//       .bias; <module>.div.mul_scale with the layer's tensors under <module>.linear.*).
// Reading matches modules as MindIE SD does (keys N.linear.weight, N.weight, N, with FLOAT
// exclusions first; per-layer values case-insensitive, model_quant_type exact).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "quant/algorithm.h"
#include "quant/schemes.h"
#include "tensor/safetensors.h"

namespace cubevec::quant {

struct Description {
  std::string path;
  std::string model_quant_type;                // as written (exact case)
  std::map<std::string, std::string> entries;  // every string-valued key (model_quant_type aside)

  static Description load(const std::string& path);
  // The weight file MindIE SD opens: quant_model_weight_{lower(model_quant_type)}[_{rank}].safetensors
  // in the description's directory, the rank suffix being the description name's trailing _<digits>.
  std::string weight_path() const;
  // The layer `module`'s algorithm, nothing when the description excludes it (FLOAT) or does not list it.
  std::optional<std::string> algorithm_value(const std::string& module) const;
  // The modules the quantized entries name (their tensor keys without the suffix and ".linear").
  std::vector<std::string> quantized_modules() const;
};

// The tensors of `module` from the weight file, converted to what QuantTensors holds (f32 scales,
// i64 deq_scale decoded, [out, 1] squeezed); errors name the file, the module and the key.
QuantTensors read_layer_tensors(const SafetensorsFile& weights, const std::string& module, Algorithm algorithm, bool has_bias);

// The pair Writer::save creates in `dir` for `algo` (model_quant_type): dir/quant_model_description_
// {lower(algo)}.json and dir/quant_model_weight_{lower(algo)}.safetensors.
std::string description_file(const std::string& dir, const std::string& algo);
std::string weight_file(const std::string& dir, const std::string& algo);

// Writing (the exporter): one layer's tensors under its module name, as msModelSlim's MindIE saver
// writes them, and the description entries for them.
struct Writer {
  std::string algo;  // model_quant_type
  nlohmann::ordered_json description = nlohmann::ordered_json::object();
  NamedTensors tensors;
  bool deq_scale_int64 = false;  // write deq_scale as i64 bit patterns (MindIE's fp16 models) instead of f32

  void add_layer(const std::string& module, Algorithm algorithm, const QuantTensors& t);
  void add_float(const std::string& name, const Tensor& value);
  // Writes quant_model_description_{algo}.json and quant_model_weight_{algo}.safetensors into `dir`.
  void save(const std::string& dir) const;
};

}  // namespace cubevec::quant
