#include "models/model_registry.h"

#include <algorithm>

#include "models/autoencoder_kl.h"
#include "models/autoencoder_kl_encoder.h"
#include "models/autoencoder_kl_wan.h"
#include "models/autoencoder_kl_wan_encoder.h"
#include "models/clip_vision_model.h"
#include "models/flux_transformer.h"
#include "models/input_checks.h"
#include "models/wan_transformer.h"
#include "base/error.h"
#include "base/strict_json.h"
#include "ops/op_stream.h"
#include "ops/vector_ops.h"

namespace cubevec::models {

namespace {

Tensor input(const std::map<std::string, Tensor>& inputs, const std::string& name) {
  const auto it = inputs.find(name);
  return it == inputs.end() ? Tensor() : it->second;
}

class FluxEntry : public ForwardModel {
 public:
  FluxEntry(const std::string& dir, const ForwardModelLoad& l) : model_(FluxTransformer2DModel::load(dir, l.dtype, l.variant)) {}
  std::string class_name() const override { return "FluxTransformer2DModel"; }
  std::vector<std::string> input_names() const override {
    return {"hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "img_ids", "txt_ids", "guidance"};
  }
  ParameterTable& parameters() override { return model_->mutable_parameters(); }
  std::optional<TensorParallelPlan> tensor_parallel_plan() const override { return model_->tensor_parallel_plan(); }
  Tensor forward(const std::map<std::string, Tensor>& in, const ForwardContext& ctx, const Stream& s) const override {
    FluxInputs f;
    f.hidden_states = input(in, "hidden_states");
    f.encoder_hidden_states = input(in, "encoder_hidden_states");
    f.pooled_projections = input(in, "pooled_projections");
    f.timestep = input(in, "timestep");
    f.img_ids = input(in, "img_ids");
    f.txt_ids = input(in, "txt_ids");
    f.guidance = input(in, "guidance");
    return model_->forward(f, s, ctx);
  }

 private:
  std::unique_ptr<FluxTransformer2DModel> model_;
};

class WanEntry : public ForwardModel {
 public:
  WanEntry(const std::string& dir, const ForwardModelLoad& l) : model_(WanTransformer3DModel::load(dir, l.dtype, l.variant)) {}
  std::string class_name() const override { return "WanTransformer3DModel"; }
  // An image-to-video transformer also takes the image encoder's states.
  std::vector<std::string> input_names() const override {
    std::vector<std::string> names{"hidden_states", "timestep", "encoder_hidden_states"};
    if (model_->config().has_image_branch()) names.push_back("encoder_hidden_states_image");
    return names;
  }
  ParameterTable& parameters() override { return model_->mutable_parameters(); }
  std::optional<TensorParallelPlan> tensor_parallel_plan() const override { return model_->tensor_parallel_plan(); }
  Tensor forward(const std::map<std::string, Tensor>& in, const ForwardContext& ctx, const Stream& s) const override {
    return model_->forward(
        {input(in, "hidden_states"), input(in, "timestep"), input(in, "encoder_hidden_states"), input(in, "encoder_hidden_states_image")},
        s, ctx);
  }

 private:
  std::unique_ptr<WanTransformer3DModel> model_;
};

// The decoders' one argument, checked here so the error names it as the user's file does.
// `layout` spells the dims ("h, w" or "T, h, w"), each of which must be at least 1.
Tensor require_latent(const std::map<std::string, Tensor>& in, const char* model, int64_t channels, const std::string& layout) {
  const Tensor latent = input(in, "latent");
  const std::string where = std::string(model) + ".decode";
  if (!latent.defined()) throw Error(where + ": the input 'latent' is missing");
  require_input_dtype(latent, where, "latent", {DType::f32, DType::bf16});
  const int64_t rank = 2 + static_cast<int64_t>(std::count(layout.begin(), layout.end(), ',')) + 1;
  bool ok = latent.dim() == rank && latent.size(1) == channels;
  for (int64_t i = 0; ok && i < rank; ++i) ok = latent.size(i) >= 1;
  if (!ok)
    throw Error(where + ": latent must be [B, " + std::to_string(channels) + ", " + layout + "] with every size at least 1, got " +
                shape_to_string(latent.shape()));
  return latent;
}

// What the VAE entry needs of each VAE: its decoder and encoder, how each loads, decodes and encodes.
struct ImageVae {
  static constexpr const char* kName = "AutoencoderKL";
  static constexpr const char* kSample = "an image";
  using Decoder = AutoencoderKLDecoder;
  using Encoder = AutoencoderKLEncoder;
  static Decoder load(const std::string& dir, const ForwardModelLoad& l) { return load_autoencoder_kl(dir, l.dtype, l.variant); }
  static Encoder load_encoder(const std::string& dir, const ForwardModelLoad& l) {
    return load_autoencoder_kl_encoder(dir, l.dtype, l.variant);
  }
  static Tensor decode(const Decoder& vae, const std::map<std::string, Tensor>& in, const Stream& s) {
    return vae.decode(require_latent(in, kName, vae.config().latent_channels, "h, w"), s);
  }
  static Tensor moments(const Encoder& encoder, const Tensor& sample, const Stream& s) { return encoder.moments(sample, s); }
  static uint64_t encode_bytes(const Encoder&, const Tensor&) { return 0; }
};

struct VideoVae {
  static constexpr const char* kName = "AutoencoderKLWan";
  static constexpr const char* kSample = "a video";
  using Decoder = AutoencoderKLWan;
  using Encoder = AutoencoderKLWanEncoder;
  static Decoder load(const std::string& dir, const ForwardModelLoad& l) { return load_autoencoder_kl_wan(dir, l.dtype, l.variant); }
  static Encoder load_encoder(const std::string& dir, const ForwardModelLoad& l) {
    return load_autoencoder_kl_wan_encoder(dir, l.dtype, l.variant);
  }
  static Tensor decode(const Decoder& vae, const std::map<std::string, Tensor>& in, const Stream& s) {
    return vae.decode(require_latent(in, kName, vae.config().z_dim, "T, h, w"), {}, s);
  }
  static Tensor moments(const Encoder& encoder, const Tensor& sample, const Stream& s) { return encoder.moments(sample, {}, s); }
  static uint64_t encode_bytes(const Encoder& encoder, const Tensor& sample) {
    return sample.dim() == 5 ? encoder.estimate_peak_bytes(sample.size(0), sample.size(3), sample.size(4)) : 0;
  }
};

// decode(latent), or encode(sample) -> the latent distribution's mean, unscaled (diffusers'
// vae.encode(sample).latent_dist.mean). The encoder loads beside the decoder; a checkpoint saved
// without it still decodes, and says why it cannot encode when asked to.
template <class Vae>
class VaeEntry : public ForwardModel {
 public:
  VaeEntry(const std::string& dir, const ForwardModelLoad& l) : vae_(Vae::load(dir, l)) {
    try {
      encoder_ = std::make_unique<typename Vae::Encoder>(Vae::load_encoder(dir, l));
    } catch (const Error& e) {
      encoder_error_ = e.what();
    }
    // --check-weights and the stages see both halves (the slots live in the models' heap modules).
    for (const ParameterTable* table : {&vae_.parameters(), encoder_ ? &encoder_->parameters() : nullptr}) {
      if (!table) continue;
      for (const ParameterSpec& spec : table->specs()) all_.add(spec.name, spec.shape, spec.slot, spec.keep_f32);
      for (const auto& [name, linear] : table->linears()) all_.add_linear(name, linear);
    }
  }
  std::string class_name() const override { return Vae::kName; }
  uint64_t estimate_bytes(const std::map<std::string, Tensor>& in) const override {
    const auto it = in.find("sample");
    return it == in.end() || !encoder_ ? 0 : Vae::encode_bytes(*encoder_, it->second);
  }
  std::vector<std::string> input_names() const override { return {"latent", "sample"}; }
  ParameterTable& parameters() override { return all_; }
  std::string output_name(const std::map<std::string, Tensor>& in) const override { return in.count("sample") ? "latent" : "sample"; }
  Tensor forward(const std::map<std::string, Tensor>& in, const ForwardContext&, const Stream& s) const override {
    const std::string name = Vae::kName;
    const bool encode = in.count("sample") > 0;
    if (encode && in.count("latent"))
      throw Error(name + ".forward: give 'sample' (" + Vae::kSample + " to encode) or 'latent' (a latent to decode), not both");
    if (!encode) return Vae::decode(vae_, in, s);
    if (!encoder_) throw Error(name + ".encode: this checkpoint's encoder cannot be loaded: " + encoder_error_);
    const Tensor sample = input(in, "sample");
    require_input_dtype(sample, name + ".encode", "sample", {DType::f32, DType::bf16});
    return latent_distribution(Vae::moments(*encoder_, sample, s), s).mean;
  }

 private:
  typename Vae::Decoder vae_;
  std::unique_ptr<typename Vae::Encoder> encoder_;
  std::string encoder_error_;
  ParameterTable all_;
};

// transformers' CLIPVisionModel: pixel_values -> penultimate_hidden_state (the main output),
// last_hidden_state and pooler_output, f32 (a bf16 or f16 input is widened first).
class ClipVisionEntry : public ForwardModel {
 public:
  ClipVisionEntry(const std::string& dir, const ForwardModelLoad& l)
      : model_(ClipVisionModel::load(dir, l.dtype, l.stream ? *l.stream : ops::default_op_stream())) {}
  std::string class_name() const override { return "CLIPVisionModel"; }
  std::vector<std::string> input_names() const override { return {"pixel_values"}; }
  ParameterTable& parameters() override { return model_->mutable_parameters(); }
  std::string output_name(const std::map<std::string, Tensor>&) const override { return "penultimate_hidden_state"; }
  Tensor forward(const std::map<std::string, Tensor>& in, const ForwardContext& ctx, const Stream& s) const override {
    return forward_outputs(in, ctx, s).front().second;
  }
  std::vector<std::pair<std::string, Tensor>> forward_outputs(const std::map<std::string, Tensor>& in, const ForwardContext&,
                                                              const Stream& s) const override {
    Tensor pixels = input(in, "pixel_values");
    require_input_dtype(pixels, "CLIPVisionModel.forward", "pixel_values", kFloatInputs);
    if (pixels.defined() && pixels.dtype() != DType::f32) pixels = ops::cast(pixels, DType::f32, s);
    const ClipVisionModel::Output o = model_->forward(pixels);
    return {{"penultimate_hidden_state", o.penultimate_hidden_state},
            {"last_hidden_state", o.last_hidden_state},
            {"pooler_output", o.pooler_output}};
  }

 private:
  std::unique_ptr<ClipVisionModel> model_;
};

using Factory = std::function<std::unique_ptr<ForwardModel>(const std::string&, const ForwardModelLoad&)>;

template <class Entry>
Factory factory() {
  return [](const std::string& dir, const ForwardModelLoad& l) { return std::make_unique<Entry>(dir, l); };
}

const std::map<std::string, Factory>& registry() {
  static const std::map<std::string, Factory> entries = {
      {"FluxTransformer2DModel", factory<FluxEntry>()}, {"WanTransformer3DModel", factory<WanEntry>()},
      {"AutoencoderKL", factory<VaeEntry<ImageVae>>()}, {"AutoencoderKLWan", factory<VaeEntry<VideoVae>>()},
      {"CLIPVisionModel", factory<ClipVisionEntry>()},
  };
  return entries;
}

// transformers' CLIPVisionModel config: model_type clip_vision_model, or architectures naming
// CLIPVisionModel or CLIPVisionModelWithProjection (the config reader checks the rest).
bool is_clip_vision_config(const nlohmann::json& config) {
  if (config.contains("model_type") && config["model_type"] == "clip_vision_model") return true;
  if (!config.contains("architectures") || !config["architectures"].is_array()) return false;
  for (const nlohmann::json& a : config["architectures"])
    if (a == "CLIPVisionModel" || a == "CLIPVisionModelWithProjection") return true;
  return false;
}

}  // namespace

std::vector<std::string> forward_model_classes() {
  std::vector<std::string> names;
  for (const auto& [name, f] : registry()) names.push_back(name);
  return names;
}

std::unique_ptr<ForwardModel> load_forward_model(const std::string& dir, const ForwardModelLoad& load) {
  const std::string config_path = dir + "/config.json";
  const nlohmann::json config = read_json_file(config_path);
  if (!config.is_object()) throw Error(config_path + ": expected a JSON object (a diffusers config with _class_name)");
  // A transformers config names its class in architectures (or model_type); Flux transformer
  // configs written without _class_name (as the tiny test checkpoints) are Flux's.
  std::string name = "FluxTransformer2DModel";
  if (is_clip_vision_config(config)) name = "CLIPVisionModel";
  if (config.contains("_class_name")) {
    if (!config["_class_name"].is_string())
      throw Error(config_path + ": '_class_name' must be a string, got " + config["_class_name"].dump());
    name = config["_class_name"].get<std::string>();
  }
  const auto it = registry().find(name);
  if (it == registry().end()) {
    std::string known;
    for (const std::string& n : forward_model_classes()) known += (known.empty() ? "" : ", ") + n;
    throw Error(config_path + ": _class_name '" + name + "' is not a model cubevec runs (expected one of: " + known + ")");
  }
  return it->second(dir, load);
}

}  // namespace cubevec::models
