#include "models/tiny_text_encoder.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <unordered_set>

#include "models/component.h"
#include "ops/attention.h"
#include "ops/vector_ops.h"
#include "tensor/checkpoint.h"
#include "base/config_reader.h"
#include "base/error.h"
#include "base/strict_json.h"

namespace cubevec::models {

// --- config -------------------------------------------------------------------------------------

TinyTextEncoderConfig TinyTextEncoderConfig::from_json(const nlohmann::json& json, const std::string& source) {
  ConfigReader r(json, source, "CubevecTinyTextEncoder");
  r.expect_class({"CubevecTinyTextEncoder"});
  TinyTextEncoderConfig c;
  std::string hidden_act = "gelu_tanh";
  r.integer("vocab_size", c.vocab_size, 1)
      .integer("max_position_embeddings", c.max_position_embeddings, 1)
      .integer("hidden_size", c.hidden_size, 1)
      .integer("num_hidden_layers", c.num_hidden_layers, 0, 1024)
      .integer("num_attention_heads", c.num_attention_heads, 1, 1024)
      .integer("intermediate_size", c.intermediate_size, 1)
      .integer("pad_token_id", c.pad_token_id, 0)
      .integer("pooled_projection_dim", c.pooled_projection_dim, 1)
      .positive_number("layer_norm_eps", c.layer_norm_eps)
      .text("hidden_act", hidden_act, {"gelu_tanh"});
  r.reject_unknown();
  r.require({"vocab_size", "max_position_embeddings", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "pad_token_id", "pooled_projection_dim"});
  if (c.hidden_size % c.num_attention_heads != 0)
    r.fail("hidden_size",
           std::to_string(c.hidden_size) + " is not a multiple of num_attention_heads " + std::to_string(c.num_attention_heads));
  if (c.pad_token_id >= c.vocab_size)
    r.fail("pad_token_id", std::to_string(c.pad_token_id) + " is not below vocab_size " + std::to_string(c.vocab_size));
  return c;
}

TinyTextEncoderConfig TinyTextEncoderConfig::load(const std::string& path) { return from_json(read_json_file(path), path); }

// --- tokenizer ------------------------------------------------------------------------------------

WordTokenizer WordTokenizer::load(const std::string& dir) {
  WordTokenizer t;
  t.source_ = dir;
  const std::string vocab_path = dir + "/vocab.json", config_path = dir + "/tokenizer_config.json";
  const nlohmann::json vocab = read_json_file(vocab_path);
  if (!vocab.is_object() || vocab.empty()) throw Error(vocab_path + ": expected a non-empty JSON object {\"word\": id, ...}");
  t.words_.assign(vocab.size(), std::string());
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [word, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= static_cast<int64_t>(vocab.size()))
      throw Error(vocab_path + ": the id of '" + word + "' must be an integer in [0, " + std::to_string(vocab.size()) + "), got " +
                  id.dump());
    const auto i = static_cast<std::size_t>(id.get<int64_t>());
    if (seen[i]) throw Error(vocab_path + ": id " + std::to_string(i) + " is given to more than one word");
    if (word.empty() || std::any_of(word.begin(), word.end(), [](char ch) { return std::isspace(static_cast<unsigned char>(ch)) != 0; }))
      throw Error(vocab_path + ": '" + word + "' is not a word (empty or with whitespace)");
    seen[i] = true;
    t.words_[i] = word;
    t.ids_[word] = static_cast<int32_t>(i);
  }
  const nlohmann::json config = read_json_file(config_path);
  ConfigReader r(config, config_path, "word tokenizer");
  std::string pad;
  r.require({"model_max_length", "pad_token"});
  r.integer("model_max_length", t.max_length_, 1)
      .text("pad_token", pad)
      .text("separators", t.separators_)
      .boolean("do_lower_case", t.lower_case_);
  if (!t.ids_.count(pad)) r.fail("pad_token", "'" + pad + "' is not in vocab.json");
  t.pad_id_ = t.ids_.at(pad);
  return t;
}

std::vector<std::string> WordTokenizer::split(const std::string& prompt) const {
  std::vector<std::string> words;
  std::string word;
  for (char ch : prompt) {
    const auto u = static_cast<unsigned char>(ch);
    if (std::isspace(u) || separators_.find(ch) != std::string::npos) {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    } else {
      word.push_back(lower_case_ ? static_cast<char>(std::tolower(u)) : ch);
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

std::string WordTokenizer::known_words() const {
  std::string out;
  for (std::size_t i = 0; i < words_.size(); ++i) {
    if (static_cast<int32_t>(i) == pad_id_) continue;
    out += (out.empty() ? "" : " ") + words_[i];
  }
  return out;
}

std::vector<int32_t> WordTokenizer::encode(const std::string& prompt) const {
  const std::vector<std::string> words = split(prompt);
  // A set keeps a huge prompt linear; the message lists a few unknown words, each shortened, so a
  // pasted essay gives one readable line rather than 100 KB.
  constexpr std::size_t kListed = 10, kShownChars = 40;
  std::unordered_set<std::string> seen;
  std::vector<std::string> unknown;
  std::size_t unknown_count = 0;
  std::vector<int32_t> ids(static_cast<std::size_t>(max_length_), pad_id_);
  for (std::size_t i = 0; i < words.size(); ++i) {
    const auto it = ids_.find(words[i]);
    if (it == ids_.end() || it->second == pad_id_) {
      if (!seen.insert(words[i]).second) continue;
      ++unknown_count;
      if (unknown.size() < kListed) unknown.push_back(words[i].size() > kShownChars ? words[i].substr(0, kShownChars) + "..." : words[i]);
    } else if (i < ids.size()) {
      ids[i] = it->second;
    }
  }
  if (unknown_count > 0) {
    std::string list;
    for (const std::string& w : unknown) list += (list.empty() ? "'" : ", '") + w + "'";
    if (unknown_count > unknown.size()) list += " and " + std::to_string(unknown_count - unknown.size()) + " more";
    throw Error("the prompt has " + std::string(unknown_count == 1 ? "a word" : std::to_string(unknown_count) + " words") +
                " this model does not know: " + list + ". It knows these " + std::to_string(words_.size() - 1) +
                " words: " + known_words());
  }
  if (static_cast<int64_t>(words.size()) > max_length_)
    throw Error("the prompt has " + std::to_string(words.size()) + " words; this model's tokenizer (" + source_ + ") takes at most " +
                std::to_string(max_length_));
  return ids;
}

// --- encoder --------------------------------------------------------------------------------------

TinyTextEncoder::TinyTextEncoder(std::string source, TinyTextEncoderConfig config, WordTokenizer tokenizer, Stream stream)
    : source_(std::move(source)),
      config_(std::move(config)),
      tokenizer_(std::move(tokenizer)),
      stream_(std::move(stream)),
      layers_(static_cast<std::size_t>(config_.num_hidden_layers)) {
  const TinyTextEncoderConfig& c = config_;
  const int64_t e = c.hidden_size;
  table_.add("embeddings.token_embedding.weight", {c.vocab_size, e}, &token_embedding_);
  table_.add("embeddings.position_embedding.weight", {c.max_position_embeddings, e}, &position_embedding_);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    Layer& l = layers_[i];
    l.ln1_weight.declare(table_, p + "layer_norm1.weight", e);
    l.ln1_bias.declare(table_, p + "layer_norm1.bias", e);
    l.q.declare(table_, p + "self_attn.q_proj", e, e);
    l.k.declare(table_, p + "self_attn.k_proj", e, e);
    l.v.declare(table_, p + "self_attn.v_proj", e, e);
    l.out.declare(table_, p + "self_attn.out_proj", e, e);
    l.ln2_weight.declare(table_, p + "layer_norm2.weight", e);
    l.ln2_bias.declare(table_, p + "layer_norm2.bias", e);
    l.fc1.declare(table_, p + "mlp.fc1", e, c.intermediate_size);
    l.fc2.declare(table_, p + "mlp.fc2", c.intermediate_size, e);
  }
  final_weight_.declare(table_, "final_layer_norm.weight", e);
  final_bias_.declare(table_, "final_layer_norm.bias", e);
  pooled_projection_.declare(table_, "pooled_projection", e, c.pooled_projection_dim);
}

bool TinyTextEncoder::present(const std::string& model_dir) { return std::filesystem::exists(model_dir + "/text_encoder/config.json"); }

std::unique_ptr<TinyTextEncoder> TinyTextEncoder::load(const std::string& model_dir, std::optional<Stream> stream) {
  const std::string dir = model_dir + "/text_encoder";
  TinyTextEncoderConfig config = TinyTextEncoderConfig::load(dir + "/config.json");
  WordTokenizer tokenizer = WordTokenizer::load(model_dir + "/tokenizer");
  if (static_cast<int64_t>(tokenizer.words().size()) != config.vocab_size)
    throw Error(model_dir + "/tokenizer/vocab.json has " + std::to_string(tokenizer.words().size()) + " words but " + dir +
                "/config.json says vocab_size " + std::to_string(config.vocab_size));
  if (tokenizer.pad_id() != config.pad_token_id)
    throw Error(model_dir + "/tokenizer's pad token has id " + std::to_string(tokenizer.pad_id()) + " but " + dir +
                "/config.json says pad_token_id " + std::to_string(config.pad_token_id));
  if (tokenizer.max_length() > config.max_position_embeddings)
    throw Error(model_dir + "/tokenizer's model_max_length " + std::to_string(tokenizer.max_length()) + " exceeds " + dir +
                "/config.json's max_position_embeddings " + std::to_string(config.max_position_embeddings));
  std::unique_ptr<TinyTextEncoder> encoder(
      new TinyTextEncoder(dir, std::move(config), std::move(tokenizer), stream ? *stream : ops::default_op_stream()));
  load_parameters(encoder->table_, open_component_weights(dir, "", "model"), DType::f32);
  return encoder;
}

PromptEmbeddings TinyTextEncoder::encode(const std::string& prompt) { return encode_ids(tokenizer_.encode(prompt)); }

PromptEmbeddings TinyTextEncoder::encode_ids(const std::vector<int32_t>& ids) const {
  const TinyTextEncoderConfig& c = config_;
  const auto length = static_cast<int64_t>(ids.size());
  const int64_t e = c.hidden_size;
  if (length < 1 || length > c.max_position_embeddings)
    throw Error("tiny text encoder: " + std::to_string(length) + " token ids, expected 1 to " + std::to_string(c.max_position_embeddings));
  // Embedding lookups on the host (the tables are f32: load_parameters stores them as f32).
  const float* tok = token_embedding_.data<float>();
  const float* pos = position_embedding_.data<float>();
  std::vector<float> x0(static_cast<std::size_t>(length * e));
  for (int64_t l = 0; l < length; ++l) {
    const int32_t id = ids[static_cast<std::size_t>(l)];
    if (id < 0 || id >= c.vocab_size)
      throw Error("tiny text encoder: token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(c.vocab_size) +
                  ")");
    for (int64_t j = 0; j < e; ++j) x0[static_cast<std::size_t>(l * e + j)] = tok[id * e + j] + pos[l * e + j];
  }
  const auto eps = static_cast<float>(c.layer_norm_eps);
  Tensor x = Tensor::from_vector(x0, {1, length, e});
  ops::AttentionOptions attention;
  attention.layout = ops::AttentionLayout::bsh;
  attention.num_heads = c.num_attention_heads;
  for (const Layer& l : layers_) {
    const Tensor h = ops::fast_layernorm(x, l.ln1_weight.value, l.ln1_bias.value, eps, ops::LayerNormImpl::high_precision, stream_).out;
    const Tensor a = ops::attention_forward(l.q(h, stream_), l.k(h, stream_), l.v(h, stream_), attention, stream_);
    x = l.out(a, stream_, {.residual = x});
    const Tensor h2 = ops::fast_layernorm(x, l.ln2_weight.value, l.ln2_bias.value, eps, ops::LayerNormImpl::high_precision, stream_).out;
    x = l.fc2(l.fc1(h2, stream_, {.activation = ops::GemmActivation::gelu_tanh}), stream_, {.residual = x});
  }
  const Tensor sequence =
      ops::fast_layernorm(x, final_weight_.value, final_bias_.value, eps, ops::LayerNormImpl::high_precision, stream_).out;
  // Mean of the non-pad rows (on the host: L x E values).
  const float* s = sequence.data<float>();
  std::vector<double> sum(static_cast<std::size_t>(e), 0.0);
  int64_t kept = 0;
  for (int64_t l = 0; l < length; ++l) {
    if (ids[static_cast<std::size_t>(l)] == c.pad_token_id) continue;
    ++kept;
    for (int64_t j = 0; j < e; ++j) sum[static_cast<std::size_t>(j)] += s[l * e + j];
  }
  std::vector<float> mean(static_cast<std::size_t>(e), 0.0f);
  if (kept > 0)
    for (int64_t j = 0; j < e; ++j)
      mean[static_cast<std::size_t>(j)] = static_cast<float>(sum[static_cast<std::size_t>(j)] / static_cast<double>(kept));
  Tensor pooled = pooled_projection_(Tensor::from_vector(mean, {1, e}), stream_);
  pooled.data_ptr();  // finished before the caller hands it to another device
  return {sequence, pooled};
}

}  // namespace cubevec::models
