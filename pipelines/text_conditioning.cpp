#include "pipelines/text_conditioning.h"

#include <algorithm>
#include <cstdio>

#include "models/pipeline_text_encoders.h"
#include "models/tiny_text_encoder.h"
#include "pipelines/memory_estimate.h"
#include "pipelines/prompt_embeds_file.h"
#include "tensor/caching_allocator.h"
#include "tensor/finite_check.h"
#include "base/error.h"
#include "base/interrupt.h"

namespace cubevec::pipelines {

namespace {

// The --prompt-embeds tensors against what the model takes, naming the file and the tensor (the
// pipeline's own check, later, knows neither). `width` of the sequence; `pooled` 0: none.
void require_embedding_shapes(const PromptEmbedsFile& file, const std::string& path, int64_t width, int64_t pooled) {
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
void require_text_memory(const models::TextEncodingMemory& need, const TextSettings& f, const std::string& what) {
  const std::string figures = human_bytes(need.total()) + " (weights and their packed copies " + human_bytes(need.weights) +
                              " + activations " + human_bytes(need.activations) + ")";
  if (!f.memory_limit.empty()) {
    const uint64_t limit = parse_memory_size(f.memory_limit, "--memory-limit");
    if (need.total() > limit)
      throw Error("text encoding with " + what + " needs about " + figures + ", more than --memory-limit " + f.memory_limit);
    default_allocator().set_memory_limit(limit);
    return;
  }
  const uint64_t available = available_memory_bytes();
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

void note_unused_negative(const PromptRequest& f, bool cfg) {
  if (!cfg && !f.negative_prompt.empty()) std::fprintf(stderr, "note: --negative-prompt is used only with --cfg fused or --cfg streams\n");
}

// --max-sequence-length pads T5 / umT5 prompts; where the length is fixed otherwise, say so.
void note_unused_max_sequence_length(const PromptRequest& f, const std::string& fixed_by) {
  if (f.max_sequence_length_given)
    std::fprintf(stderr, "note: --max-sequence-length %d is not used: %s\n", f.max_sequence_length, fixed_by.c_str());
}

// A prompt through the shipped tiny models' own text encoder; its errors name `flag`, the option
// the text came from.
models::PromptEmbeddings tiny_encode(models::TinyTextEncoder& encoder, const std::string& text, const std::string& flag) {
  try {
    return encoder.encode(text);
  } catch (const Interrupted&) {
    throw;  // a stop signal is not the prompt's fault
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
TextConditioning tiny_text(models::TinyTextEncoder& encoder, const PromptRequest& f, bool cfg) {
  TextConditioning t;
  t.positive = tiny_prompt(encoder, f.prompt);
  if (cfg) t.negative = tiny_encode(encoder, f.negative_prompt, "--negative-prompt");
  note_unused_negative(f, cfg);
  note_unused_max_sequence_length(
      f, "this model's text encoder pads every prompt to its own " + std::to_string(encoder.tokenizer().max_length()) + " tokens");
  t.source = encoder.name();
  return t;
}

// --prompt-embeds: the file's tensors, checked against what the transformer takes.
TextConditioning embeddings_from_file(const PromptRequest& f, const TextInput& input) {
  const bool flux = input.family == TextInput::Family::flux;
  const PromptEmbedsFile file = PromptEmbedsFile::load(f.prompt_embeds, /*with_pooled=*/flux);
  require_embedding_shapes(file, f.prompt_embeds, input.sequence_width, input.pooled_width);
  note_unused_max_sequence_length(f, "the embeddings in " + f.prompt_embeds + " are already encoded");
  TextConditioning t;
  t.positive = file.positive;
  t.negative = file.negative;
  t.source = "embeddings from " + f.prompt_embeds;
  if (flux && !f.prompt.empty()) std::fprintf(stderr, "note: --prompt-embeds given, so the text of --prompt is not encoded\n");
  return t;
}

// Shapes only: T5's tokens and CLIP's pooled vector as FLUX.1 uses them, umT5's tokens as Wan2.1.
TextConditioning shape_only_embeddings(const PromptRequest& f, const TextInput& input) {
  TextConditioning t;
  t.positive.sequence = Tensor::meta({1, f.max_sequence_length, input.sequence_width}, DType::f32);
  if (input.pooled_width > 0) t.positive.pooled = Tensor::meta({1, input.pooled_width}, DType::f32);
  t.negative = t.positive;
  t.source = input.family == TextInput::Family::flux ? "shape-only T5/CLIP embeddings" : "shape-only umT5 embeddings";
  return t;
}

std::string width_mismatch(const std::string& dir, int64_t width, const std::string& what, const std::string& transformer_key,
                           int64_t expected) {
  return dir + " is " + std::to_string(width) + " wide" + what + " but the transformer's " + transformer_key + " is " +
         std::to_string(expected);
}

}  // namespace

TextInput TextInput::of(const models::FluxConfig& config) {
  return {Family::flux, config.joint_attention_dim, config.pooled_projection_dim};
}

TextInput TextInput::of(const models::WanConfig& config) { return {Family::wan, config.text_dim, 0}; }

TextEncoders::~TextEncoders() = default;

std::unique_ptr<TextEncoders> TextEncoders::load(const std::string& model_dir, const TextInput& input, const TextSettings& s,
                                                 int max_sequence_length, const Stream& stream) {
  std::unique_ptr<TextEncoders> e(new TextEncoders());
  e->dir_ = model_dir;
  e->input_ = input;
  const models::TextEncoderKind kind = models::text_encoder_kind(model_dir);
  if (input.family == TextInput::Family::flux) {
    if (kind == models::TextEncoderKind::clip_t5) {
      models::FluxTextEncoder::check_max_sequence_length(max_sequence_length);
      models::TextEncodingMemory need = models::estimate_text_encoding_memory(model_dir + "/text_encoder", s.dtype, 77);
      const models::TextEncodingMemory t5 =
          models::estimate_text_encoding_memory(model_dir + "/text_encoder_2", s.dtype, max_sequence_length);
      need.weights += t5.weights;
      need.activations = std::max(need.activations, t5.activations);
      require_text_memory(need, s, "CLIP and T5");
      e->flux_ = models::FluxTextEncoder::load(model_dir, s.dtype, max_sequence_length, stream);
      if (s.check_weights) {
        models::require_finite_parameters(e->flux_->clip().parameters(), model_dir + "/text_encoder");
        models::require_finite_parameters(e->flux_->t5().parameters(), model_dir + "/text_encoder_2");
      }
      if (e->flux_->clip().config().hidden_size != input.pooled_width)
        throw Error(width_mismatch(model_dir + "/text_encoder", e->flux_->clip().config().hidden_size, "", "pooled_projection_dim",
                                   input.pooled_width));
      if (e->flux_->t5().config().d_model != input.sequence_width)
        throw Error(width_mismatch(model_dir + "/text_encoder_2", e->flux_->t5().config().d_model, " (d_model)", "joint_attention_dim",
                                   input.sequence_width));
    } else if (kind == models::TextEncoderKind::umt5) {
      throw Error(model_dir + "/text_encoder is Wan's umT5, not Flux's CLIP: is this a Wan folder?");
    } else if (kind == models::TextEncoderKind::tiny) {
      e->tiny_ = models::TinyTextEncoder::load(model_dir, stream);  // the shipped tinyflux's
    }
    return e;
  }
  if (kind == models::TextEncoderKind::umt5) {
    models::WanTextEncoder::check_max_sequence_length(max_sequence_length);
    require_text_memory(models::estimate_text_encoding_memory(model_dir + "/text_encoder", s.dtype, max_sequence_length), s, "umT5");
    e->wan_ = models::WanTextEncoder::load(model_dir, s.dtype, max_sequence_length, stream);
    if (s.check_weights) models::require_finite_parameters(e->wan_->umt5().parameters(), model_dir + "/text_encoder");
    if (e->wan_->umt5().config().d_model != input.sequence_width)
      throw Error(
          width_mismatch(model_dir + "/text_encoder", e->wan_->umt5().config().d_model, " (d_model)", "text_dim", input.sequence_width));
  } else if (kind == models::TextEncoderKind::tiny) {
    // The shipped assets/tinywan's own encoder: its sequence output is Wan's encoder_hidden_states.
    e->tiny_ = models::TinyTextEncoder::load(model_dir, stream);
    if (e->tiny_->config().hidden_size != input.sequence_width)
      throw Error(
          width_mismatch(model_dir + "/text_encoder", e->tiny_->config().hidden_size, " (hidden_size)", "text_dim", input.sequence_width));
  } else if (kind == models::TextEncoderKind::clip_t5) {
    throw Error(model_dir + "/text_encoder is not Wan's umT5 encoder: pass --prompt-embeds FILE with prompt_embeds [1, L, " +
                std::to_string(input.sequence_width) + "] (and negative_prompt_embeds for CFG)");
  }
  return e;
}

TextConditioning TextEncoders::encode(const PromptRequest& f, bool cfg) {
  const bool flux = input_.family == TextInput::Family::flux;
  TextConditioning t;
  if (!f.prompt_embeds.empty()) {
    t = embeddings_from_file(f, input_);
  } else if (flux_ || wan_) {
    require_prompt_text(f.prompt);
    models::TextEncoder& encoder = flux_ ? static_cast<models::TextEncoder&>(*flux_) : *wan_;
    const auto encode_as = [&](const std::string& text, const std::string& what) {
      return flux_ ? flux_->encode_as(text, what) : wan_->encode_as(text, what);
    };
    if (flux_) flux_->set_max_sequence_length(f.max_sequence_length);
    else wan_->set_max_sequence_length(f.max_sequence_length);
    t.positive = encode_as(f.prompt, "--prompt");
    require_finite_embeddings(t.positive, encoder.name(), "--prompt");
    if (cfg) {
      t.negative = encode_as(f.negative_prompt, "--negative-prompt");  // both pipelines' default negative is ""
      require_finite_embeddings(*t.negative, encoder.name(), "--negative-prompt");
    }
    note_unused_negative(f, cfg);
    t.source = encoder.name();
  } else if (tiny_) {
    t = tiny_text(*tiny_, f, cfg);
    if (!flux) {  // Wan takes the sequence only
      t.positive.pooled = Tensor{};
      if (t.negative) t.negative->pooled = Tensor{};
    }
  } else if (flux) {
    throw Error(dir_ +
                " has no text_encoder/ to encode --prompt with: pass --prompt-embeds FILE, or use a folder with text_encoder/ + "
                "tokenizer/ (CLIP) and text_encoder_2/ + tokenizer_2/ (T5)");
  } else {
    throw Error(dir_ + " has no text_encoder/ (umT5) to encode --prompt with: pass --prompt-embeds FILE with prompt_embeds [1, L, " +
                std::to_string(input_.sequence_width) + "] (and negative_prompt_embeds for CFG)");
  }
  if (cfg && !t.negative)
    throw Error(flux ? "CFG needs negative embeddings: negative_prompt_embeds and negative_pooled_prompt_embeds in the --prompt-embeds file"
                     : "CFG needs negative_prompt_embeds in the --prompt-embeds file (or --cfg off)");
  return t;
}

namespace {

TextConditioning one_shot_text(const std::string& model_dir, const PromptRequest& f, const TextSettings& settings, bool cfg, bool simulate,
                               const TextInput& input, const Stream& stream) {
  if (!f.prompt_embeds.empty()) {
    // No encoder is loaded for a file of embeddings.
    TextConditioning t = embeddings_from_file(f, input);
    if (cfg && !t.negative)
      throw Error(
          input.family == TextInput::Family::flux
              ? "CFG needs negative embeddings: negative_prompt_embeds and negative_pooled_prompt_embeds in the --prompt-embeds file"
              : "CFG needs negative_prompt_embeds in the --prompt-embeds file (or --cfg off)");
    return t;
  }
  if (simulate) return shape_only_embeddings(f, input);
  // A prompt the real encoders would only pad is refused before they load.
  const models::TextEncoderKind kind = models::text_encoder_kind(model_dir);
  if (kind == (input.family == TextInput::Family::flux ? models::TextEncoderKind::clip_t5 : models::TextEncoderKind::umt5))
    require_prompt_text(f.prompt);
  return TextEncoders::load(model_dir, input, settings, f.max_sequence_length, stream)->encode(f, cfg);
}

}  // namespace

TextConditioning flux_text(const std::string& model_dir, const PromptRequest& f, const TextSettings& settings, bool cfg, bool simulate,
                           const models::FluxConfig& config, const Stream& stream) {
  return one_shot_text(model_dir, f, settings, cfg, simulate, TextInput::of(config), stream);
}

TextConditioning wan_text(const std::string& model_dir, const PromptRequest& f, const TextSettings& settings, bool cfg, bool simulate,
                          const models::WanConfig& config, const Stream& stream) {
  return one_shot_text(model_dir, f, settings, cfg, simulate, TextInput::of(config), stream);
}

}  // namespace cubevec::pipelines
