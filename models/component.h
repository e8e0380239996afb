// How a component folder of a diffusers model (transformer/, vae/, text_encoder/) is read: as
// diffusers and transformers read it, the weights file by its name, whatever other safetensors
// files lie beside it.
#pragma once

#include <string>

#include "tensor/checkpoint.h"

namespace cubevec::models {

// The weights of the component in `dir`: `<name>.safetensors.index.json` (sharded) or else
// `<name>.safetensors`; with a variant ("fp16", "bf16", ...), `<name>.safetensors.index.<variant>.json`
// or `<name>.<variant>.safetensors`, as diffusers names them. `name` is "diffusion_pytorch_model"
// (diffusers) or "model" (transformers' text encoders). A folder without that file is an error
// naming the folder, the file expected and the safetensors files it does hold.
Checkpoint open_component_weights(const std::string& dir, const std::string& variant = "",
                                  const std::string& name = "diffusion_pytorch_model");

}  // namespace cubevec::models
