#include "cli/text_conditioning.h"

#include <algorithm>
#include <cstdio>

#include "models/pipeline_text_encoders.h"
#include "models/tiny_text_encoder.h"
#include "pipelines/memory_estimate.h"
#include "pipelines/prompt_embeds_file.h"
#include "tensor/caching_allocator.h"
#include "tensor/finite_check.h"
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

// The encoders' estimate against --memory-limit (or the memory available now), before they load;
// the allocator is held to the limit while they run.
void require_text_memory(const models::TextEncodingMemory& need, const PromptFlags& f, const std::string& what) {
  const std::string figures = human_bytes(need.total()) + " (weights and their packed copies " + human_bytes(need.weights) +
                              " + activations " + human_bytes(need.activations) + ")";
  if (!f.memory_limit.empty()) {
    const uint64_t limit = pipelines::parse_memory_size(f.memory_limit, "--memory-limit");
    if (need.total() > limit)
      throw Error("text encoding with " + what + " needs about " + figures + ", more than --memory-limit " + f.memory_limit);
    default_allocator().set_memory_limit(limit);
    return;
  }
  const uint64_t available = pipelines::available_memory_bytes();
  if (available > 0 && need.total() > available)
    throw Error("text encoding with " + what + " needs about " + figures + ", more than the " + human_bytes(available) +
                " available now (give --memory-limit to set another limit)");
}

// A prompt of whitespace only is no prompt (the real encoders would encode it as the empty one).
void require_prompt_text(const std::string& prompt) {
  if (prompt.find_first_not_of(" \t\n\r\f\v") == std::string::npos)
    throw Error("--prompt TEXT is required" + std::string(prompt.empty() ? "" : " (the prompt given is only whitespace)") +
                " (or --prompt-embeds FILE)");
}

// The encoders' outputs must be finite: a NaN weight would otherwise surface as a denoising failure.
void require_finite_embeddings(const models::PromptEmbeddings& e, const std::string& encoder, const std::string& what) {
  const std::string why = encoder + ": the embeddings of " + what + " are not finite (a weight gives NaN or inf; --check-weights names it)";
  require_finite(e.sequence, why);
  if (e.pooled.defined()) require_finite(e.pooled, why);
}

void note_unused_negative(const PromptFlags& f, bool cfg) {
  if (!cfg && !f.negative_prompt.empty()) std::fprintf(stderr, "note: --negative-prompt is used only with --cfg fused or --cfg streams\n");
}

// --max-sequence-length pads T5 / umT5 prompts; where the length is fixed otherwise, say so.
void note_unused_max_sequence_length(const PromptFlags& f, const std::string& fixed_by) {
  if (f.max_sequence_length_given)
    std::fprintf(stderr, "note: --max-sequence-length %d is not used: %s\n", f.max_sequence_length, fixed_by.c_str());
}

// A prompt through the shipped tiny models' own text encoder; its errors name `flag`, the option
// the text came from.
models::PromptEmbeddings tiny_encode(models::TinyTextEncoder& encoder, const std::string& text, const std::string& flag) {
  try {
    return encoder.encode(text);
  } catch (const Error& e) {
    throw Error(flag + ": " + e.what());
  }
}

// --prompt through that encoder. A prompt of spaces or separators has no words: the same error as
// no prompt (it would otherwise render the unconditional output as if asked for).
models::PromptEmbeddings tiny_prompt(models::TinyTextEncoder& encoder, const std::string& prompt) {
  if (encoder.tokenizer().split(prompt).empty())
    throw Error("--prompt TEXT is required" + std::string(prompt.empty() ? "" : " ('" + prompt + "' has no words)") +
                " (this model's text encoder knows these words: " + encoder.tokenizer().known_words() + ")");
  return tiny_encode(encoder, prompt, "--prompt");
}

// The shipped tiny models' own text encoder: --prompt, and --negative-prompt for CFG (empty: the
// empty caption, the unconditional input they were trained with).
TextConditioning tiny_text(models::TinyTextEncoder& encoder, const PromptFlags& f, bool cfg) {
  TextConditioning t;
  t.positive = tiny_prompt(encoder, f.prompt);
  if (cfg) t.negative = tiny_encode(encoder, f.negative_prompt, "--negative-prompt");
  note_unused_negative(f, cfg);
  note_unused_max_sequence_length(f, "this model's text encoder pads every prompt to its own " +
                                         std::to_string(encoder.tokenizer().max_length()) + " tokens");
  t.source = encoder.name();
  return t;
}

}  // namespace

TextConditioning flux_text(const std::string& model_dir, const PromptFlags& f, bool cfg, bool simulate, const models::FluxConfig& mc,
                           const Stream& stream) {
  TextConditioning t;
  if (!f.prompt_embeds.empty()) {
    const pipelines::PromptEmbedsFile file = pipelines::PromptEmbedsFile::load(f.prompt_embeds);
    require_embedding_shapes(file, f.prompt_embeds, mc.joint_attention_dim, mc.pooled_projection_dim);
    note_unused_max_sequence_length(f, "the embeddings in " + f.prompt_embeds + " are already encoded");
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
    require_prompt_text(f.prompt);
    models::FluxTextEncoder::check_max_sequence_length(f.max_sequence_length);
    models::TextEncodingMemory need = models::estimate_text_encoding_memory(model_dir + "/text_encoder", f.dtype, 77);
    const models::TextEncodingMemory t5 = models::estimate_text_encoding_memory(model_dir + "/text_encoder_2", f.dtype, f.max_sequence_length);
    need.weights += t5.weights;
    need.activations = std::max(need.activations, t5.activations);
    require_text_memory(need, f, "CLIP and T5");
    auto encoder = models::FluxTextEncoder::load(model_dir, f.dtype, f.max_sequence_length, stream);
    if (f.check_weights) {
      models::require_finite_parameters(encoder->clip().parameters(), model_dir + "/text_encoder");
      models::require_finite_parameters(encoder->t5().parameters(), model_dir + "/text_encoder_2");
    }
    if (encoder->clip().config().hidden_size != mc.pooled_projection_dim)
      throw Error(model_dir + "/text_encoder is " + std::to_string(encoder->clip().config().hidden_size) +
                  " wide but the transformer's pooled_projection_dim is " + std::to_string(mc.pooled_projection_dim));
    if (encoder->t5().config().d_model != mc.joint_attention_dim)
      throw Error(model_dir + "/text_encoder_2 is " + std::to_string(encoder->t5().config().d_model) +
                  " wide (d_model) but the transformer's joint_attention_dim is " + std::to_string(mc.joint_attention_dim));
    t.positive = encoder->encode_as(f.prompt, "--prompt");
    require_finite_embeddings(t.positive, encoder->name(), "--prompt");
    if (cfg) {
      t.negative = encoder->encode_as(f.negative_prompt, "--negative-prompt");
      require_finite_embeddings(*t.negative, encoder->name(), "--negative-prompt");
    }
    note_unused_negative(f, cfg);
    t.source = encoder->name();
  } else if (kind == models::TextEncoderKind::umt5) {
    throw Error(model_dir + "/text_encoder is Wan's umT5, not Flux's CLIP: is this a Wan folder?");
  } else if (kind == models::TextEncoderKind::tiny) {
    t = tiny_text(*models::TinyTextEncoder::load(model_dir, stream), f, cfg);  // the shipped tinyflux's
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
    note_unused_max_sequence_length(f, "the embeddings in " + f.prompt_embeds + " are already encoded");
    t.positive = file.positive;
    t.negative = file.negative;
    t.source = "embeddings from " + f.prompt_embeds;
  } else if (simulate) {
    // Shapes only: umT5's tokens, as Wan2.1 uses them.
    t.positive.sequence = Tensor::meta({1, f.max_sequence_length, mc.text_dim}, DType::f32);
    t.negative = t.positive;
    t.source = "shape-only umT5 embeddings";
  } else if (const models::TextEncoderKind kind = models::text_encoder_kind(model_dir); kind == models::TextEncoderKind::umt5) {
    require_prompt_text(f.prompt);
    models::WanTextEncoder::check_max_sequence_length(f.max_sequence_length);
    require_text_memory(models::estimate_text_encoding_memory(model_dir + "/text_encoder", f.dtype, f.max_sequence_length), f, "umT5");
    auto encoder = models::WanTextEncoder::load(model_dir, f.dtype, f.max_sequence_length, stream);
    if (f.check_weights) models::require_finite_parameters(encoder->umt5().parameters(), model_dir + "/text_encoder");
    if (encoder->umt5().config().d_model != mc.text_dim)
      throw Error(model_dir + "/text_encoder is " + std::to_string(encoder->umt5().config().d_model) +
                  " wide (d_model) but the transformer's text_dim is " + std::to_string(mc.text_dim));
    t.positive = encoder->encode_as(f.prompt, "--prompt");
    require_finite_embeddings(t.positive, encoder->name(), "--prompt");
    if (cfg) {
      t.negative = encoder->encode_as(f.negative_prompt, "--negative-prompt");  // WanPipeline's default negative is ""
      require_finite_embeddings(*t.negative, encoder->name(), "--negative-prompt");
    }
    note_unused_negative(f, cfg);
    t.source = encoder->name();
  } else if (kind == models::TextEncoderKind::tiny) {
    // The model's own text encoder (the shipped assets/tinywan): its sequence output is Wan's
    // encoder_hidden_states (the pooled one is not used); the empty prompt is the unconditional input.
    auto encoder = models::TinyTextEncoder::load(model_dir, stream);
    if (encoder->config().hidden_size != mc.text_dim)
      throw Error(model_dir + "/text_encoder is " + std::to_string(encoder->config().hidden_size) +
                  " wide (hidden_size) but the transformer's text_dim is " + std::to_string(mc.text_dim));
    t = tiny_text(*encoder, f, cfg);
    t.positive.pooled = Tensor{};
    if (t.negative) t.negative->pooled = Tensor{};
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
