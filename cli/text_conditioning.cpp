#include "cli/text_conditioning.h"

#include <cstdio>

#include "models/pipeline_text_encoders.h"
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
    // Shapes only: T5's tokens and CLIP's pooled vector, as FLUX.1 uses them.
    t.positive = {Tensor::meta({1, f.max_sequence_length, mc.joint_attention_dim}, DType::f32),
                  Tensor::meta({1, mc.pooled_projection_dim}, DType::f32)};
    t.negative = t.positive;
    t.source = "shape-only T5/CLIP embeddings";
  } else if (const models::TextEncoderKind kind = models::text_encoder_kind(model_dir); kind == models::TextEncoderKind::clip_t5) {
    if (f.prompt.empty()) throw Error("--prompt TEXT is required (or --prompt-embeds FILE)");
    auto encoder = models::FluxTextEncoder::load(model_dir, f.dtype, f.max_sequence_length, stream);
    if (encoder->clip().config().hidden_size != mc.pooled_projection_dim)
      throw Error(model_dir + "/text_encoder is " + std::to_string(encoder->clip().config().hidden_size) +
                  " wide but the transformer's pooled_projection_dim is " + std::to_string(mc.pooled_projection_dim));
    if (encoder->t5().config().d_model != mc.joint_attention_dim)
      throw Error(model_dir + "/text_encoder_2 is " + std::to_string(encoder->t5().config().d_model) +
                  " wide (d_model) but the transformer's joint_attention_dim is " + std::to_string(mc.joint_attention_dim));
    t.positive = encoder->encode(f.prompt);
    if (cfg) t.negative = encoder->encode(f.negative_prompt);
    t.source = encoder->name();
  } else if (kind == models::TextEncoderKind::umt5) {
    throw Error(model_dir + "/text_encoder is Wan's umT5, not Flux's CLIP: is this a Wan folder?");
  } else if (kind == models::TextEncoderKind::tiny) {
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
    throw Error(model_dir + " has no text_encoder/ to encode --prompt with: pass --prompt-embeds FILE, or use a folder with text_encoder/ + "
                "tokenizer/ (CLIP) and text_encoder_2/ + tokenizer_2/ (T5)");
  }
  if (cfg && !t.negative)
    throw Error("CFG needs negative embeddings: negative_prompt_embeds and negative_pooled_prompt_embeds in the --prompt-embeds file");
  return t;
}

TextConditioning wan_text(const std::string& model_dir, const PromptFlags& f, bool cfg, bool simulate, const models::WanConfig& mc,
                          const Stream& stream) {
  TextConditioning t;
  if (!f.prompt_embeds.empty()) {
    const pipelines::PromptEmbedsFile file = pipelines::PromptEmbedsFile::load(f.prompt_embeds, /*with_pooled=*/false);
    require_embedding_shapes(file, f.prompt_embeds, mc.text_dim, 0);
    t.positive = file.positive;
    t.negative = file.negative;
    t.source = "embeddings from " + f.prompt_embeds;
  } else if (simulate) {
    // Shapes only: umT5's tokens, as Wan2.1 uses them.
    t.positive.sequence = Tensor::meta({1, f.max_sequence_length, mc.text_dim}, DType::f32);
    t.negative = t.positive;
    t.source = "shape-only umT5 embeddings";
  } else if (const models::TextEncoderKind kind = models::text_encoder_kind(model_dir); kind == models::TextEncoderKind::umt5) {
    if (f.prompt.empty()) throw Error("--prompt TEXT is required (or --prompt-embeds FILE)");
    auto encoder = models::WanTextEncoder::load(model_dir, f.dtype, f.max_sequence_length, stream);
    if (encoder->umt5().config().d_model != mc.text_dim)
      throw Error(model_dir + "/text_encoder is " + std::to_string(encoder->umt5().config().d_model) +
                  " wide (d_model) but the transformer's text_dim is " + std::to_string(mc.text_dim));
    t.positive = encoder->encode(f.prompt);
    if (cfg) t.negative = encoder->encode(f.negative_prompt);  // WanPipeline's default negative is ""
    t.source = encoder->name();
  } else {
    throw Error(model_dir + (kind == models::TextEncoderKind::none ? " has no text_encoder/ (umT5) to encode --prompt with"
                                                                   : "/text_encoder is not Wan's umT5 encoder") +
                ": pass --prompt-embeds FILE with prompt_embeds [1, L, " + std::to_string(mc.text_dim) +
                "] (and negative_prompt_embeds for CFG)");
  }
  if (cfg && !t.negative) throw Error("CFG needs negative_prompt_embeds in the --prompt-embeds file (or --cfg off)");
  return t;
}

}  // namespace cubevec::cli
