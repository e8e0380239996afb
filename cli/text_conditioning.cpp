#include "cli/text_conditioning.h"

#include <cstdio>

#include "models/tiny_text_encoder.h"
#include "pipelines/prompt_embeds_file.h"
#include "tensor/error.h"

namespace cubevec::cli {

TextConditioning flux_text(const std::string& model_dir, const PromptFlags& f, bool cfg, bool simulate, const models::FluxConfig& mc,
                           const Stream& stream) {
  TextConditioning t;
  if (!f.prompt_embeds.empty()) {
    const pipelines::PromptEmbedsFile file = pipelines::PromptEmbedsFile::load(f.prompt_embeds);
    t.positive = file.positive;
    t.negative = file.negative;
    t.source = "embeddings from " + f.prompt_embeds;
    if (!f.prompt.empty()) std::fprintf(stderr, "note: --prompt-embeds given, so the text of --prompt is not encoded\n");
  } else if (simulate) {
    // Shapes only: T5's 512 tokens and CLIP's pooled vector, as FLUX.1 uses them.
    t.positive = {Tensor::meta({1, 512, mc.joint_attention_dim}, DType::f32), Tensor::meta({1, mc.pooled_projection_dim}, DType::f32)};
    t.negative = t.positive;
    t.source = "shape-only T5/CLIP embeddings";
  } else if (models::TinyTextEncoder::present(model_dir)) {
    // The model's own text encoder (the shipped tiny model): --prompt, and --negative-prompt for
    // true CFG (empty: the empty caption, the unconditional input the model was trained with).
    auto encoder = models::TinyTextEncoder::load(model_dir, stream);
    // A prompt of spaces or separators has no words: the same error as no prompt (it would
    // otherwise render the unconditional picture as if asked for).
    if (encoder->tokenizer().split(f.prompt).empty())
      throw Error("--prompt TEXT is required" + std::string(f.prompt.empty() ? "" : " ('" + f.prompt + "' has no words)") +
                  " (this model's text encoder knows these words: " + encoder->tokenizer().known_words() + ")");
    t.positive = encoder->encode(f.prompt);
    if (cfg) t.negative = encoder->encode(f.negative_prompt);
    else if (!f.negative_prompt.empty()) std::fprintf(stderr, "note: --negative-prompt is used only with --cfg fused or --cfg streams\n");
    t.source = encoder->name();
  } else {
    throw Error(model_dir + " has no text encoder cubevec can run yet (CLIP-L / T5-XXL come in a later issue): pass --prompt-embeds FILE");
  }
  if (cfg && !t.negative)
    throw Error("CFG needs negative embeddings: negative_prompt_embeds and negative_pooled_prompt_embeds in the --prompt-embeds file");
  return t;
}

TextConditioning wan_text(const std::string&, const PromptFlags& f, bool cfg, bool simulate, const models::WanConfig& mc) {
  TextConditioning t;
  if (!f.prompt_embeds.empty()) {
    const pipelines::PromptEmbedsFile file = pipelines::PromptEmbedsFile::load(f.prompt_embeds, /*with_pooled=*/false);
    t.positive = file.positive;
    t.negative = file.negative;
    t.source = "embeddings from " + f.prompt_embeds;
  } else if (simulate) {
    // Shapes only: umT5's 512 tokens, as Wan2.1 uses them.
    t.positive.sequence = Tensor::meta({1, 512, mc.text_dim}, DType::f32);
    t.negative = t.positive;
    t.source = "shape-only umT5 embeddings";
  } else {
    throw Error("Wan's umT5-XXL text encoder is not implemented yet" + std::string(f.prompt.empty() ? "" : " (so --prompt cannot be encoded)") +
                ": pass --prompt-embeds FILE with prompt_embeds [1, L, " + std::to_string(mc.text_dim) +
                "] (and negative_prompt_embeds for CFG)");
  }
  if (cfg && !t.negative) throw Error("CFG needs negative_prompt_embeds in the --prompt-embeds file (or --cfg off)");
  return t;
}

}  // namespace cubevec::cli
