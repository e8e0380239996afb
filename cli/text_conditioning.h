// Where a generation command's text conditioning comes from, decided once for t2i, t2v and
// tune-cache: --prompt-embeds, the model's own text encoder (--prompt: CLIP + T5 for Flux, umT5 for
// Wan, or the shipped tiny model's), or, in simulate mode, shape-only embeddings of the real
// encoders' sizes. The encoders are loaded here and freed on return, before the transformer loads.
#pragma once

#include <optional>
#include <string>

#include "device/stream.h"
#include "models/flux_transformer.h"
#include "models/text_encoder.h"
#include "models/wan_transformer.h"

namespace cubevec::cli {

struct PromptFlags {
  std::string prompt, negative_prompt, prompt_embeds;
  int max_sequence_length = 512;  // T5 / umT5 tokens (--max-sequence-length)
  bool max_sequence_length_given = false;  // on the command line (a note when it cannot apply)
  // Set by the command from its other flags:
  DType dtype = DType::f32;   // the run's dtype: encoders stored f32 run in it
  bool check_weights = false;  // --check-weights covers the encoders' weights too
  std::string memory_limit;    // --memory-limit: text encoding must fit it as well
};

struct TextConditioning {
  models::PromptEmbeddings positive;
  std::optional<models::PromptEmbeddings> negative;  // set when `cfg` asked for it
  std::string source;                                // for the report: "embeddings from FILE", ...
};

// Flux: T5-like sequence + CLIP-like pooled vector. `cfg`: a negative is needed (an error otherwise).
TextConditioning flux_text(const std::string& model_dir, const PromptFlags& flags, bool cfg, bool simulate,
                           const models::FluxConfig& config, const Stream& stream);
// Wan: umT5-like sequence only.
TextConditioning wan_text(const std::string& model_dir, const PromptFlags& flags, bool cfg, bool simulate,
                          const models::WanConfig& config, const Stream& stream);

}  // namespace cubevec::cli
