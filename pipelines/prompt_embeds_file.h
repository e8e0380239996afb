// --prompt-embeds FILE: precomputed text conditioning, for models whose text encoders cubevec does not
// run (or to compare with another implementation on the same embeddings).
#pragma once

#include <optional>
#include <string>

#include "models/text_encoder.h"

namespace cubevec::pipelines {

using models::PromptEmbeddings;

// --prompt-embeds FILE: a safetensors file holding one prompt's embeddings, named as diffusers'
// FluxPipeline arguments: `prompt_embeds` [1, L, D] and `pooled_prompt_embeds` [1, P], optionally
// `negative_prompt_embeds` and `negative_pooled_prompt_embeds` for true CFG. (The forward names
// `encoder_hidden_states` / `pooled_projections` are accepted too.) 2-D tensors get a batch dim.
// Without with_pooled (Wan: umT5 states only) the pooled tensors are neither needed nor read.
struct PromptEmbedsFile {
  PromptEmbeddings positive;
  std::optional<PromptEmbeddings> negative;

  static PromptEmbedsFile load(const std::string& path, bool with_pooled = true);
};

}  // namespace cubevec::pipelines
