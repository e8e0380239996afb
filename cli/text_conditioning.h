// Where a generation command's text conditioning comes from, decided once for t2i, t2v and
// tune-cache: --prompt-embeds, the model's own text encoder (--prompt), or, in simulate mode,
// shape-only embeddings of the real encoders' sizes.
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
                          const models::WanConfig& config);

}  // namespace cubevec::cli
