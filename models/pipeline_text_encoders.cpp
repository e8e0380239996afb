#include "models/pipeline_text_encoders.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "models/component.h"
#include "base/config_reader.h"
#include "base/error.h"
#include "base/regular_file.h"
#include "base/strict_json.h"
#include "tokenizers/prompt_clean.h"

namespace cubevec::models {

namespace {

// model_dir/name must be a folder.
void require_component_folder(const std::string& model_dir, const std::string& name, const std::string& has, const std::string& needs) {
  if (!folder_exists(model_dir + "/" + name, ": " + needs)) throw Error(model_dir + " " + has + " but no " + name + "/: " + needs);
}

}  // namespace

EncoderConfigKind encoder_config_kind(const std::string& config_path) {
  const nlohmann::json config = read_json_file(config_path);
  if (!config.is_object()) throw Error(config_path + ": expected a JSON object");
  if (config.contains("_class_name") && config["_class_name"] == "CubevecTinyTextEncoder") return EncoderConfigKind::tiny;
  const std::string type = config.contains("model_type") && config["model_type"].is_string() ? config["model_type"].get<std::string>() : "";
  if (type == "clip_text_model") return EncoderConfigKind::clip;
  if (type == "umt5") return EncoderConfigKind::umt5;
  if (type == "t5" || type == "mt5") return EncoderConfigKind::t5;
  if (config.contains("architectures") && config["architectures"].is_array())
    for (const nlohmann::json& a : config["architectures"]) {
      if (!a.is_string()) continue;
      const std::string name = a.get<std::string>();
      if (name == "CLIPTextModel" || name == "CLIPTextModelWithProjection") return EncoderConfigKind::clip;
      if (name.rfind("UMT5", 0) == 0) return EncoderConfigKind::umt5;
      if (name.rfind("T5", 0) == 0 || name.rfind("MT5", 0) == 0) return EncoderConfigKind::t5;
    }
  throw Error(config_path +
              ": not a text encoder cubevec runs (expected model_type clip_text_model, t5 or umt5, architectures "
              "CLIPTextModel, T5EncoderModel or UMT5EncoderModel, or the shipped CubevecTinyTextEncoder); its model_type is '" +
              type + "'");
}

TextEncoderKind text_encoder_kind(const std::string& model_dir) {
  const std::string path = model_dir + "/text_encoder/config.json";
  if (!std::filesystem::exists(path)) return TextEncoderKind::none;
  switch (encoder_config_kind(path)) {
    case EncoderConfigKind::tiny: return TextEncoderKind::tiny;
    case EncoderConfigKind::clip: return TextEncoderKind::clip_t5;
    case EncoderConfigKind::umt5: return TextEncoderKind::umt5;
    case EncoderConfigKind::t5: break;
  }
  throw Error(path +
              ": a T5EncoderModel is Flux's text_encoder_2, not a text_encoder (expected CLIPTextModel (Flux) or "
              "UMT5EncoderModel (Wan))");
}

void check_text_component_classes(const std::string& model_dir) {
  const std::string path = model_dir + "/model_index.json";
  if (!std::filesystem::exists(path)) return;
  const nlohmann::json index = read_json_file(path);
  if (!index.is_object()) throw Error(path + ": expected a JSON object");
  static const char* const kEncoders[] = {"CLIPTextModel", "CLIPTextModelWithProjection", "T5EncoderModel", "UMT5EncoderModel"};
  static const char* const kTokenizers[] = {"CLIPTokenizer", "CLIPTokenizerFast", "T5Tokenizer", "T5TokenizerFast", "AutoTokenizer"};
  for (const auto& [key, value] : index.items()) {
    const bool encoder = key.rfind("text_encoder", 0) == 0, tokenizer = key.rfind("tokenizer", 0) == 0;
    if ((!encoder && !tokenizer) || value.is_null()) continue;
    // diffusers writes ["library", "ClassName"] (or [null, null] for a component left out).
    if (!value.is_array() || value.size() != 2 || (!value[1].is_string() && !value[1].is_null()))
      throw Error(path + ": '" + key + "' must be [\"library\", \"ClassName\"], got " + value.dump());
    if (value[1].is_null()) continue;
    const std::string cls = value[1].get<std::string>();
    const auto named = [&](const char* k) { return cls == k; };
    const bool known = encoder ? std::any_of(std::begin(kEncoders), std::end(kEncoders), named)
                               : std::any_of(std::begin(kTokenizers), std::end(kTokenizers), named);
    if (!known)
      throw Error(path + ": '" + key + "' is " + cls + ", a " + (encoder ? "text encoder" : "tokenizer") +
                  " class cubevec does not have (it runs " +
                  (encoder ? "CLIPTextModel, T5EncoderModel and UMT5EncoderModel" : "CLIPTokenizer and T5Tokenizer, slow or fast") +
                  "); pass --prompt-embeds FILE made elsewhere");
  }
}

DType encoder_weight_dtype(const std::string& encoder_dir, DType run_dtype) {
  if (run_dtype == DType::bf16) return DType::bf16;
  return encoder_weight_dtype(open_component_weights(encoder_dir, "", "model"), run_dtype);
}

DType encoder_weight_dtype(const Checkpoint& checkpoint, DType run_dtype) {
  if (run_dtype == DType::bf16) return DType::bf16;
  for (const std::string& name : checkpoint.names()) {
    const SafetensorsEntry& e = checkpoint.entry(name);
    if (e.shape.size() >= 2 && e.dtype->dtype == DType::bf16) return DType::bf16;
  }
  return DType::f32;
}

void compute_in_run_dtype(const ParameterTable& table, DType run_dtype) {
  if (run_dtype != DType::f32) return;
  for (const auto& [name, linear] : table.linears())
    if (linear->weight.dtype() == DType::bf16) linear->widen_bf16 = true;
}

TextEncodingMemory estimate_text_encoding_memory(const std::string& encoder_dir, DType run_dtype, int64_t length) {
  const Checkpoint checkpoint = open_component_weights(encoder_dir, "", "model");
  const DType kept = encoder_weight_dtype(checkpoint, run_dtype);
  TextEncodingMemory m;
  for (const std::string& name : checkpoint.names()) {
    const SafetensorsEntry& e = checkpoint.entry(name);
    uint64_t count = 1;
    for (const int64_t d : e.shape) count *= static_cast<uint64_t>(d);
    const bool matrix = e.shape.size() >= 2;
    // Matrices at the kept dtype plus their packed panels (f32 in an f32 run); vectors f32.
    m.weights += matrix ? count * (dtype_size(kept) + dtype_size(run_dtype)) : count * 4;
  }
  const nlohmann::json config = read_json_file(encoder_dir + "/config.json");
  const auto number = [&](const char* key, int64_t fallback) {
    return config.is_object() && config.contains(key) && config[key].is_number_unsigned() ? config[key].get<int64_t>() : fallback;
  };
  const auto l = static_cast<uint64_t>(length);
  const auto width = static_cast<uint64_t>(std::max(number("d_model", 0), number("hidden_size", 0)));
  const auto inner = static_cast<uint64_t>(std::max(number("d_ff", 0), number("intermediate_size", 0)));
  const auto heads = static_cast<uint64_t>(std::max<int64_t>(1, std::max(number("num_heads", 0), number("num_attention_heads", 0))));
  // The residual stream, a norm's output, q / k / v / attention output, the FFN's three inner
  // tensors; T5's bias [heads, L, L] (f32) and the math path's scores of the same size.
  m.activations = 4 * l * (8 * width + 3 * inner) + 2 * 4 * heads * l * l;
  return m;
}

Tensor zero_padded_rows(const Tensor& hidden, const std::vector<int32_t>& attention_mask) {
  if (!hidden.has_storage()) return hidden;
  Tensor out = hidden.clone();  // a copy: contiguous() may share `hidden`'s storage, which the caller keeps
  const int64_t width = out.size(2);
  auto* p = out.mutable_data<float>();
  for (std::size_t i = 0; i < attention_mask.size(); ++i)
    if (attention_mask[i] == 0) std::memset(p + static_cast<int64_t>(i) * width, 0, static_cast<std::size_t>(width) * sizeof(float));
  return out;
}

// --- Flux ----------------------------------------------------------------------------------------------

void FluxTextEncoder::check_max_sequence_length(int max_sequence_length) {
  if (max_sequence_length < 1 || max_sequence_length > 512)
    throw Error("--max-sequence-length must be from 1 to 512 for Flux (FluxPipeline's limit), got " + std::to_string(max_sequence_length));
}

std::unique_ptr<FluxTextEncoder> FluxTextEncoder::load(const std::string& model_dir, DType run_dtype, int max_sequence_length,
                                                       const Stream& stream) {
  check_max_sequence_length(max_sequence_length);
  check_text_component_classes(model_dir);
  std::unique_ptr<FluxTextEncoder> e(new FluxTextEncoder());
  e->source_ = model_dir;
  e->max_sequence_length_ = max_sequence_length;
  for (const char* sub : {"/text_encoder_2", "/tokenizer", "/tokenizer_2"})
    require_component_folder(model_dir, sub + 1, "has text_encoder/ (CLIP)",
                             "a Flux folder needs text_encoder/ + tokenizer/ (CLIP) and text_encoder_2/ + tokenizer_2/ (T5)");
  e->clip_tokenizer_ = tokenizers::ClipTokenizer::load(model_dir + "/tokenizer");
  e->t5_tokenizer_ = tokenizers::T5Tokenizer::load(model_dir + "/tokenizer_2");
  const std::string clip_dir = model_dir + "/text_encoder", t5_dir = model_dir + "/text_encoder_2";
  e->clip_ = ClipTextModel::load(clip_dir, encoder_weight_dtype(clip_dir, run_dtype), stream);
  e->t5_ = T5EncoderModel::load(t5_dir, encoder_weight_dtype(t5_dir, run_dtype), stream);
  compute_in_run_dtype(e->clip_->parameters(), run_dtype);
  compute_in_run_dtype(e->t5_->parameters(), run_dtype);
  if (e->t5_->config().umt5) throw Error(t5_dir + "/config.json: Flux's text_encoder_2 is a T5EncoderModel, this is a UMT5EncoderModel");
  return e;
}

std::string FluxTextEncoder::name() const {
  return "CLIPTextModel (" + std::to_string(clip_->config().num_hidden_layers) + " layers) + T5EncoderModel (" +
         std::to_string(t5_->config().num_layers) + " layers, " + std::to_string(max_sequence_length_) + " tokens) from " + source_;
}

void FluxTextEncoder::set_max_sequence_length(int max_sequence_length) {
  check_max_sequence_length(max_sequence_length);
  max_sequence_length_ = max_sequence_length;
}

PromptEmbeddings FluxTextEncoder::encode_as(const std::string& prompt, const std::string& what) {
  const std::vector<int32_t> clip_ids = clip_tokenizer_.encode_padded(prompt, 0, what + " (CLIP)");
  const ClipTextOutput clip = clip_->forward(clip_ids);
  const tokenizers::PaddedIds t5_ids = t5_tokenizer_->encode_padded(prompt, max_sequence_length_, what + " (T5)");
  Tensor sequence = t5_->forward(t5_ids.ids);  // FluxPipeline passes no mask
  sequence.data_ptr();                         // finished before the caller hands it to another device
  clip.pooler_output.data_ptr();
  return {sequence, clip.pooler_output};
}

// --- Wan -----------------------------------------------------------------------------------------------

void WanTextEncoder::check_max_sequence_length(int max_sequence_length) {
  if (max_sequence_length < 1 || max_sequence_length > 4096)
    throw Error("--max-sequence-length must be from 1 to 4096 for Wan, got " + std::to_string(max_sequence_length));
}

std::unique_ptr<WanTextEncoder> WanTextEncoder::load(const std::string& model_dir, DType run_dtype, int max_sequence_length,
                                                     const Stream& stream) {
  check_max_sequence_length(max_sequence_length);
  check_text_component_classes(model_dir);
  std::unique_ptr<WanTextEncoder> e(new WanTextEncoder());
  e->source_ = model_dir;
  e->max_sequence_length_ = max_sequence_length;
  require_component_folder(model_dir, "tokenizer", "has text_encoder/ (umT5)", "a Wan folder needs both");
  e->tokenizer_ = tokenizers::T5Tokenizer::load(model_dir + "/tokenizer");
  const std::string dir = model_dir + "/text_encoder";
  e->umt5_ = T5EncoderModel::load(dir, encoder_weight_dtype(dir, run_dtype), stream);
  compute_in_run_dtype(e->umt5_->parameters(), run_dtype);
  return e;
}

std::string WanTextEncoder::name() const {
  return "UMT5EncoderModel (" + std::to_string(umt5_->config().num_layers) + " layers, " + std::to_string(max_sequence_length_) +
         " tokens) from " + source_;
}

void WanTextEncoder::set_max_sequence_length(int max_sequence_length) {
  check_max_sequence_length(max_sequence_length);
  max_sequence_length_ = max_sequence_length;
}

PromptEmbeddings WanTextEncoder::encode_as(const std::string& prompt, const std::string& what) {
  const tokenizers::PaddedIds ids = tokenizer_->encode_padded(tokenizers::wan_prompt_clean(prompt, what), max_sequence_length_, what);
  PromptEmbeddings out;
  out.sequence = zero_padded_rows(umt5_->forward(ids.ids, ids.attention_mask), ids.attention_mask);
  return out;
}

}  // namespace cubevec::models
