// Text conditioning for the Flux pipeline: whatever turns a prompt into the sequence embeddings
// (encoder_hidden_states, T5's role) and the pooled vector (pooled_projections, CLIP's role).
// Real CLIP-L / T5-XXL arrive in a later issue; today there are precomputed embeddings from a file
// (--prompt-embeds) and, with the shipped tiny model, its own small encoder.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "tensor/tensor.h"

namespace cubevec::pipelines {

struct PromptEmbeddings {
  Tensor sequence;  // [1, L, joint_attention_dim]
  Tensor pooled;    // [1, pooled_projection_dim] (undefined for Wan, which has none)
};

class TextEncoder {
 public:
  virtual ~TextEncoder() = default;
  virtual std::string name() const = 0;
  // Throws cubevec::Error for a prompt it cannot encode, saying why.
  virtual PromptEmbeddings encode(const std::string& prompt) = 0;
};

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

// A TextEncoder that returns fixed embeddings whatever the prompt (the file's).
class FixedTextEncoder : public TextEncoder {
 public:
  FixedTextEncoder(std::string source, PromptEmbeddings embeddings)
      : source_(std::move(source)), embeddings_(std::move(embeddings)) {}
  std::string name() const override { return "embeddings from " + source_; }
  PromptEmbeddings encode(const std::string&) override { return embeddings_; }

 private:
  std::string source_;
  PromptEmbeddings embeddings_;
};

}  // namespace cubevec::pipelines
