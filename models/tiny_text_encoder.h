// The text encoder of the tiny model cubevec ships (assets/tinyflux, trained by tools/tinyflux/):
// a word-level tokenizer over a fixed vocabulary and a two-layer pre-LN transformer encoder,
// producing the sequence embeddings [1, L, hidden_size] and the pooled vector
// [1, pooled_projection_dim] a Flux transformer takes. Its PyTorch twin is TinyTextEncoder in
// tools/tinyflux/modules.py; the parameter names are the state_dict's (CLIP-like):
//
//   embeddings.token_embedding.weight [V, E], embeddings.position_embedding.weight [P, E]
//   layers.i.{layer_norm1, layer_norm2}.{weight, bias} [E]
//   layers.i.self_attn.{q_proj, k_proj, v_proj, out_proj}.{weight [E, E], bias [E]}
//   layers.i.mlp.fc1.{weight [I, E], bias [I]}, layers.i.mlp.fc2.{weight [E, I], bias [E]}
//   final_layer_norm.{weight, bias} [E], pooled_projection.{weight [D, E], bias [D]}
//
// Forward, for ids [L] (L = the tokenizer's model_max_length, padded with the pad id):
//   x = token_embedding[ids] + position_embedding[0 .. L)           (on the host)
//   per layer: x += out_proj(attention(q_proj, k_proj, v_proj of LN1(x)))   (all L tokens, no mask,
//              heads of E / num_attention_heads, scale head_dim^-1/2)
//              x += fc2(gelu_tanh(fc1(LN2(x))))
//   sequence = final_layer_norm(x)
//   pooled   = pooled_projection(mean of the sequence rows whose id is not the pad id; zeros if none)
// LayerNorms use layer_norm_eps. As in FluxPipeline's T5, padding is attended to and kept.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/stream.h"
#include "models/layers.h"
#include "models/text_encoder.h"

namespace cubevec::models {

// text_encoder/config.json ("_class_name": "CubevecTinyTextEncoder").
struct TinyTextEncoderConfig {
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t intermediate_size = 0;
  int64_t pad_token_id = 0;
  int64_t pooled_projection_dim = 0;
  double layer_norm_eps = 1e-5;
  std::string hidden_act = "gelu_tanh";  // the only one supported

  // Every key but those starting with '_' is required; unknown keys, wrong types and values
  // this encoder cannot run are errors naming `source` and the key.
  static TinyTextEncoderConfig from_json(const nlohmann::json& json, const std::string& source);
  static TinyTextEncoderConfig load(const std::string& path);
};

// tokenizer/vocab.json ({"word": id, ...}, ids 0 .. V-1 each once) and tokenizer/tokenizer_config.json
// (model_max_length, pad_token; separators and do_lower_case optional, other keys ignored).
// A prompt is lower-cased (ASCII), each separator character becomes a space, and the
// whitespace-separated words are looked up one by one.
class WordTokenizer {
 public:
  static WordTokenizer load(const std::string& tokenizer_dir);

  // The words of `prompt` as the tokenizer splits them.
  std::vector<std::string> split(const std::string& prompt) const;
  // ids [model_max_length], padded with the pad id. Throws cubevec::Error for a word outside the
  // vocabulary (naming every such word and listing the known ones) or for too many words.
  std::vector<int32_t> encode(const std::string& prompt) const;

  const std::vector<std::string>& words() const { return words_; }  // by id, the pad token included
  int64_t max_length() const { return max_length_; }
  int32_t pad_id() const { return pad_id_; }
  std::string known_words() const;  // the vocabulary without the pad token, space-separated, by id

 private:
  std::string source_;
  std::vector<std::string> words_;
  std::map<std::string, int32_t> ids_;
  int64_t max_length_ = 0;
  int32_t pad_id_ = 0;
  std::string separators_ = ",.;:!?";
  bool lower_case_ = true;
};

class TinyTextEncoder : public TextEncoder {
 public:
  // model_dir/text_encoder/ (config.json + one .safetensors file) and model_dir/tokenizer/. The
  // encoder's kernels run on `stream` (the default op stream when not given).
  static std::unique_ptr<TinyTextEncoder> load(const std::string& model_dir, std::optional<Stream> stream = std::nullopt);
  // Whether model_dir has a text_encoder/config.json to load.
  static bool present(const std::string& model_dir);

  std::string name() const override { return "tiny text encoder (" + source_ + ")"; }
  PromptEmbeddings encode(const std::string& prompt) override;
  // The forward for token ids [L] (L <= max_position_embeddings; ids < vocab_size).
  PromptEmbeddings encode_ids(const std::vector<int32_t>& ids) const;

  const TinyTextEncoderConfig& config() const { return config_; }
  const WordTokenizer& tokenizer() const { return tokenizer_; }
  const ParameterTable& parameters() const { return table_; }

 private:
  struct Layer {
    Vector1d ln1_weight, ln1_bias, ln2_weight, ln2_bias;
    Linear q, k, v, out, fc1, fc2;
  };
  TinyTextEncoder(std::string source, TinyTextEncoderConfig config, WordTokenizer tokenizer, Stream stream);

  std::string source_;
  TinyTextEncoderConfig config_;
  WordTokenizer tokenizer_;
  Stream stream_;
  ParameterTable table_;
  Tensor token_embedding_, position_embedding_;
  std::vector<Layer> layers_;  // sized once in the constructor: the table points into it
  Vector1d final_weight_, final_bias_;
  Linear pooled_projection_;
};

}  // namespace cubevec::models
