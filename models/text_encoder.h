// Text conditioning: whatever turns a prompt into the sequence embeddings (encoder_hidden_states:
// T5's role in Flux, umT5's in Wan) and the pooled vector (pooled_projections, CLIP's role in Flux).
// Implementations: the shipped tiny model's encoder (models/tiny_text_encoder.h) and fixed
// embeddings (--prompt-embeds, pipelines/prompt_embeds_file.h).
#pragma once

#include <memory>
#include <string>

#include "tensor/tensor.h"

namespace cubevec::models {

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

// A TextEncoder that returns fixed embeddings whatever the prompt (the file's).
class FixedTextEncoder : public TextEncoder {
 public:
  FixedTextEncoder(std::string source, PromptEmbeddings embeddings) : source_(std::move(source)), embeddings_(std::move(embeddings)) {}
  std::string name() const override { return "embeddings from " + source_; }
  PromptEmbeddings encode(const std::string&) override { return embeddings_; }

 private:
  std::string source_;
  PromptEmbeddings embeddings_;
};

}  // namespace cubevec::models
