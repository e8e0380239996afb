// LoRA adapters fused into a model's Linear weights, as diffusers' load_lora_weights + fuse_lora
// (PEFT): W' = W + scale * (alpha / rank) * B A, for every layer the file names. This first part
// reads diffusers / PEFT files: `<prefix>.<module>.lora_A.weight` [rank, in] and `.lora_B.weight`
// [out, rank] (prefix "transformer." or none), with an optional `<module>.alpha` (kohya's; without
// one alpha is the rank, as PEFT's default for diffusers' saved adapters). kohya's names and the
// runtime (unfused) path are to come (issue 39, Deliver 5).
#pragma once

#include <string>
#include <vector>

#include "models/parameters.h"
#include "tensor/tensor.h"

namespace cubevec::models {

struct LoraLayer {
  std::string module;  // the diffusers module name: "transformer_blocks.0.attn.to_q"
  Tensor down, up;     // A [rank, in] and B [out, rank], f32
  double alpha = 0;    // alpha / rank scales the product (alpha = rank when the file has none)
};

struct LoraAdapter {
  std::string path;
  std::vector<LoraLayer> layers;
};

// Reads a LoRA safetensors file. Keys that are neither lora_A / lora_B weights nor alphas, a layer
// with only one of A and B, mismatched ranks, or non-finite values are errors naming the file and
// the key.
LoraAdapter read_lora(const std::string& path);

// Fuses `adapter` at `scale` into the Linears of `table` (their weights replaced by new tensors of
// the same dtype; the fused product in f32, rounded once). A module the table does not have is an
// error listing the first such names (with `ignore_unmatched`, they are skipped and counted);
// shapes that do not fit the layer are an error naming it. Returns the number of layers fused.
int fuse_lora(const ParameterTable& table, const LoraAdapter& adapter, double scale, bool ignore_unmatched = false,
              int* unmatched = nullptr);

// "FILE" or "FILE:SCALE" (SCALE a finite number, default 1) as the command line gives it.
std::pair<std::string, double> parse_lora_flag(const std::string& text);

}  // namespace cubevec::models
