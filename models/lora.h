// LoRA adapters on a model's Linear layers, as diffusers' load_lora_weights (+ fuse_lora, PEFT):
// W' = W + scale * (alpha / rank) * B A for every layer the file names, and, for Wan's `diff_b`
// tensors, b' = b + scale * diff_b. The formats (docs/models.md, "LoRA"):
//  * diffusers / PEFT: `[transformer.]<module>.lora_A.weight` [rank, in], `.lora_B.weight` [out, rank],
//    an optional `<module>.alpha` (without one alpha is the rank);
//  * kohya / sd-scripts for Flux: `lora_unet_double_blocks_N_img_attn_qkv.lora_down.weight`,
//    `.lora_up.weight`, `.alpha`, with the fused qkv (and the single blocks' `linear1`: q, k, v and
//    the MLP) split over diffusers' modules as diffusers' conversion splits them (A shared, B's rows
//    split), and the global layers (img_in, txt_in, time_in, vector_in, guidance_in, final_layer,
//    whose adaLN rows are swapped from BFL's shift, scale to diffusers' scale, shift);
//  * Wan's original names (`diffusion_model.blocks.N.self_attn.q.lora_A.weight` or lora_down/up,
//    `.alpha`, `.diff_b`) and kohya musubi-tuner's (`lora_unet_blocks_N_cross_attn_k_img...`), mapped
//    to diffusers' as its Wan conversion maps them.
// A layer is applied either fused into the weight at load (fuse_lora) or at run time beside it
// (pipelines/stages/lora_stage.h), from the same resolve_lora().
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "models/parameters.h"
#include "tensor/tensor.h"

namespace cubevec::models {

struct LoraLayer {
  std::string name;                  // as the file names it: "transformer_blocks.0.attn.to_q", "lora_unet_single_blocks_3_linear1"
  std::vector<std::string> modules;  // the model's Linears it changes: one, or a fused kohya layer's parts in row order
  bool swap_halves = false;          // kohya's final_layer_adaLN_modulation_1: B's two row halves swapped
  Tensor down, up;                   // A [rank, in] and B [out, rank] f32 (undefined for a bias-only layer)
  Tensor bias;                       // Wan's diff_b [out] f32, or undefined
  double alpha = 0;                  // alpha / rank scales B A (alpha = rank when the file has none)
};

struct LoraAdapter {
  std::string path;
  std::string format;  // "diffusers", "kohya-flux", "wan", "musubi-wan"
  std::vector<LoraLayer> layers;
};

// Reads a LoRA safetensors file in any of the formats above (told apart by its keys). Keys of no
// LoRA form, a layer with only one of A and B, mismatched ranks, non-float or non-finite tensors, and
// keys of two formats in one file are errors naming the file and the key. Keys of a known format
// that name no module cubevec knows (a text encoder's `lora_te_*`, Wan's `.diff`) become layers
// whose module is their own name, so resolving lists them as unmatched.
LoraAdapter read_lora(const std::string& path);

// One module's share of a LoRA layer: y += factor * (x down^T) up^T (+ factor_bias * bias).
struct LoraDelta {
  std::string module;
  Linear* layer = nullptr;
  Tensor down, up;         // [rank, in], [layer.out, rank] f32 (up already split and swapped)
  Tensor bias;             // [layer.out] f32 or undefined
  double factor = 0;       // scale * alpha / rank
  double bias_factor = 0;  // scale
};

// The deltas of `adapter` at `scale` on `table`'s Linears. A layer one of whose modules the table
// does not have is unmatched: an error listing the first such names (with `ignore_unmatched`, they
// are skipped and counted in *unmatched); none matching at all is always an error. Shapes that do not
// fit the layer (a split whose parts do not add up to B's rows) are errors naming it.
std::vector<LoraDelta> resolve_lora(const ParameterTable& table, const LoraAdapter& adapter, double scale, bool ignore_unmatched = false,
                                    int* unmatched = nullptr);

// Fuses `adapter` at `scale` into the Linears of `table` (their weights and biases replaced by new
// tensors of the same dtype; the fused product in double, rounded once). Returns the number of
// modules changed.
int fuse_lora(const ParameterTable& table, const LoraAdapter& adapter, double scale, bool ignore_unmatched = false,
              int* unmatched = nullptr);

// "FILE" or "FILE:SCALE" (SCALE a finite number, default 1) as the command line gives it.
std::pair<std::string, double> parse_lora_flag(const std::string& text);

}  // namespace cubevec::models
