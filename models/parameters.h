// Parameters by their diffusers names. A model declares every tensor it needs (full name, expected
// shape, and the Tensor member it fills) in a ParameterTable; load_parameters then fills them all
// from a checkpoint, checking every name and shape, and reports every problem in one error.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "tensor/checkpoint.h"
#include "tensor/tensor.h"

namespace cubevec::models {

struct Linear;

struct ParameterSpec {
  std::string name;  // the checkpoint key, e.g. "transformer_blocks.0.attn.to_q.weight"
  Shape shape;
  Tensor* slot = nullptr;  // filled by the loaders below
  bool keep_f32 = false;   // stays f32 in bf16 mode (a modulation table the model adds in f32)
};

class ParameterTable {
 public:
  // Registers `name` (throws on a duplicate). The slot must outlive the table's use. keep_f32: the
  // tensor stays f32 when the model is loaded in bf16 (as diffusers' _keep_in_fp32_modules).
  void add(const std::string& name, Shape shape, Tensor* slot, bool keep_f32 = false);
  const std::vector<ParameterSpec>& specs() const { return specs_; }
  int64_t numel() const;  // total elements of every parameter

  // The layer registry: every Linear by its diffusers module name ("transformer_blocks.0.attn.to_q"),
  // so a stage can swap a layer's implementation after load (quantization, tensor parallelism).
  void add_linear(const std::string& module_name, Linear* layer);  // throws on a duplicate
  const std::map<std::string, Linear*>& linears() const { return linears_; }
  // The Linear named `module_name`; an Error naming it (and a close name, when one exists) otherwise.
  Linear& linear(const std::string& module_name) const;

 private:
  std::vector<ParameterSpec> specs_;
  std::unordered_set<std::string> names_;  // of specs_: declaring stays linear in the parameter count
  std::map<std::string, Linear*> linears_;
};

// --check-weights: every loaded parameter must hold finite values, else an Error
// "<component>: weight '<name>': element [i, j] is nan (expected finite values)". One pass over the
// weights (a second read of a large model), so the commands ask for it rather than always doing it.
void require_finite_parameters(const ParameterTable& table, const std::string& component);

// Fills every slot from `checkpoint`, stored as `dtype` (f32 or bf16; f32, bf16 and f16 checkpoint
// tensors are converted, f32 ones kept zero-copy when dtype is f32). With bf16, matrices and
// kernels (2-D and up) are stored bf16 while vectors (biases, norm weights) stay f32. Throws one cubevec::Error
// naming the checkpoint and listing every missing, unexpected and mis-shaped tensor, and every
// tensor of a dtype that is not a float.
void load_parameters(const ParameterTable& table, const Checkpoint& checkpoint, DType dtype = DType::f32);

// For a table that covers only part of a checkpoint (a VAE's decoder without its encoder): only
// checkpoint tensors whose names start with one of `unexpected_prefixes` are reported as
// unexpected; the others are ignored. An empty list means every undeclared tensor is unexpected,
// as load_parameters(table, checkpoint, dtype) does. Missing, mis-shaped and non-float declared
// tensors are reported either way.
struct LoadOptions {
  std::vector<std::string> unexpected_prefixes{};
  std::vector<std::string> ignored_names{};  // never reported (a buffer such as CLIP's position_ids)
};
void load_parameters(const ParameterTable& table, const Checkpoint& checkpoint, DType dtype, const LoadOptions& options);

// Shape-only parameters for simulate mode.
void make_meta_parameters(const ParameterTable& table, DType dtype);

// Deterministic random parameters, uniform in [-scale, scale] (biases and norm weights too), for
// tests and benchmarks that need no checkpoint.
void make_random_parameters(const ParameterTable& table, DType dtype, uint64_t seed, float scale = 0.02f);

}  // namespace cubevec::models
