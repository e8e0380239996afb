#include "cli/text_conditioning.h"

#include <cstdio>

#include "models/tiny_text_encoder.h"
#include "pipelines/prompt_embeds_file.h"
#include "tensor/error.h"

namespace cubevec::cli {

namespace {

// The --prompt-embeds tensors against what the model takes, naming the file and the tensor (the
// pipeline's own check, later, knows neither). `width` of the sequence; `pooled` 0: none.
void require_embedding_shapes(const pipelines::PromptEmbedsFile& file, const std::string& path, int64_t width, int64_t pooled) {
  const auto check = [&](const models::PromptEmbeddings& e, const std::string& prefix) {
    const Tensor& s = e.sequence;
    if (s.defined() && (s.dim() != 3 || s.size(0) != 1 || s.size(1) < 1 || s.size(2) != width))
      throw Error(path + ": '" + prefix + "prompt_embeds' must be [1, L, " + std::to_string(width) + "] with L >= 1 for this model, got " +
                  shape_to_string(s.shape()));
    const Tensor& p = e.pooled;
    if (pooled > 0 && p.defined() && (p.dim() != 2 || p.size(0) != 1 || p.size(1) != pooled))
      throw Error(path + ": '" + prefix + "pooled_prompt_embeds' must be [1, " + std::to_string(pooled) + "] for this model, got " +
                  shape_to_string(p.shape()));
  };
  check(file.positive, "");
  if (file.negative) check(*file.negative, "negative_");
}

}  // namespace

TextConditioning flux_text(const std::string& model_dir, const PromptFlags& f, bool cfg, bool simulate, const models::FluxConfig& mc,
                           const Stream& stream) {
  TextConditioning t;
  if (!f.prompt_embeds.empty()) {
    const pipelines::PromptEmbedsFile file = pipelines::PromptEmbedsFile::load(f.prompt_embeds);
    require_embedding_shapes(file, f.prompt_embeds, mc.joint_attention_dim, mc.pooled_projection_dim);
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
    require_embedding_shapes(file, f.prompt_embeds, mc.text_dim, 0);
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
