// What the text encoders share when reading a transformers-format folder (config.json +
// model.safetensors or a sharded index): the architecture check and the embedding lookup.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "base/config_reader.h"
#include "tensor/tensor.h"

namespace cubevec::models {

// `architectures` (when present) must name one of `architectures` and `model_type` (when present)
// one of `model_types`; otherwise an Error naming the file, what it says and what cubevec runs.
// transformers' configs carry many keys a forward does not use, so unknown keys are not errors.
void expect_transformers_architecture(ConfigReader& reader, std::initializer_list<std::string_view> architectures,
                                      std::initializer_list<std::string_view> model_types);

// Rows `ids` of an embedding table [V, E] (f32 or bf16) as f32 [1, L, E], gathered on the host;
// an id outside [0, V) is an Error naming `what`.
Tensor embedding_rows(const Tensor& table, const std::vector<int32_t>& ids, const std::string& what);

}  // namespace cubevec::models
