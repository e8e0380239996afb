// Reading a diffusers Wan folder into a WanT2VPipeline: model_index.json, the scheduler, the
// transformer (and Wan2.2 A14B's second expert), the VAE and its encoder, the image encoder; with
// real weights (load) or shapes only (load_meta). The generation itself is pipelines/wan_t2v.cpp.
#include <array>
#include <cmath>
#include <filesystem>
#include <memory>

#include "base/interrupt.h"
#include "base/error.h"
#include "base/strict_json.h"
#include "pipelines/wan_t2v.h"

namespace cubevec::pipelines {

namespace {

// The model's scheduler: UniPC or FlowMatch Euler by _class_name; the Wan2.1 480p repos' UniPC
// (flow shift 3) when the directory has none.
WanSchedulerConfig wan_scheduler_of(const std::string& model_dir) {
  const std::string path = model_dir + "/scheduler/scheduler_config.json";
  if (!std::filesystem::exists(path)) {
    print_notice_once(model_dir +
                      " has no scheduler/scheduler_config.json; using the Wan2.1 480p repositories' "
                      "(UniPCMultistepScheduler, flow shift 3)");
    UniPCConfig c;
    c.flow_shift = 3.0;
    return c;
  }
  const nlohmann::json json = read_json_file(path);
  if (json.is_object() && json.contains("_class_name") && !json["_class_name"].is_string())
    throw Error(path + ": '_class_name' must be a string (UniPCMultistepScheduler or FlowMatchEulerDiscreteScheduler), got " +
                json["_class_name"].dump());
  if (json.is_object() && json.value("_class_name", std::string()) == "UniPCMultistepScheduler") return UniPCConfig::from_json(json, path);
  return FlowMatchConfig::from_json(json, path);
}

void require_wan_folder(const std::string& dir) {
  if (!std::filesystem::is_directory(dir + "/transformer"))
    throw Error(dir + ": not a diffusers Wan model directory (expected transformer/, vae/ and scheduler/)");
}

// The second expert's folder, which boundary_ratio needs (and which is not used without it).
void check_experts(const std::string& dir, const WanModelIndex& index) {
  const bool second = std::filesystem::is_directory(dir + "/transformer_2");
  if (index.boundary_ratio && !second)
    throw Error(dir + "/model_index.json sets boundary_ratio (two experts, Wan2.2 A14B) but " + dir +
                "/transformer_2 (the low-noise expert) " +
                (std::filesystem::exists(dir + "/transformer_2") ? "is not a folder" : "is missing"));
  if (!index.boundary_ratio && second)
    throw Error(dir + " has transformer_2/ (a second expert) but its model_index.json sets no boundary_ratio saying when it runs");
}

void check_expert_pair(const models::WanTransformer3DModel& high, const models::WanTransformer3DModel& low, const std::string& dir) {
  const models::WanConfig &a = high.config(), &b = low.config();
  const auto text = [](const std::array<int64_t, 3>& p) {
    return "[" + std::to_string(p[0]) + ", " + std::to_string(p[1]) + ", " + std::to_string(p[2]) + "]";
  };
  const struct {
    const char* key;
    std::string first, second;
  } fields[] = {{"in_channels", std::to_string(a.in_channels), std::to_string(b.in_channels)},
                {"out_channels", std::to_string(a.out_channels), std::to_string(b.out_channels)},
                {"patch_size", text(a.patch_size), text(b.patch_size)},
                {"text_dim", std::to_string(a.text_dim), std::to_string(b.text_dim)},
                {"image_dim", std::to_string(a.image_dim), std::to_string(b.image_dim)},
                // One module tree: offload, tensor parallel and the packed cache plan the experts alike.
                {"num_layers", std::to_string(a.num_layers), std::to_string(b.num_layers)},
                {"num_attention_heads", std::to_string(a.num_attention_heads), std::to_string(b.num_attention_heads)},
                {"attention_head_dim", std::to_string(a.attention_head_dim), std::to_string(b.attention_head_dim)},
                {"ffn_dim", std::to_string(a.ffn_dim), std::to_string(b.ffn_dim)}};
  for (const auto& f : fields)
    if (f.first != f.second)
      throw Error(dir + ": transformer/ and transformer_2/ differ: " + f.key + " is " + f.first + " and " + f.second +
                  " (the two experts must be interchangeable, one module tree)");
}

}  // namespace

WanModelIndex WanModelIndex::load(const std::string& dir) {
  const std::string path = dir + "/model_index.json";
  std::error_code error;
  const bool present = std::filesystem::exists(path, error);
  if (error) throw Error(path + ": " + error.message());
  WanModelIndex index;
  if (!present) return index;
  const nlohmann::json json = read_json_file(path);
  if (!json.is_object()) throw Error(path + ": expected a JSON object (diffusers' model_index.json)");
  if (const auto it = json.find("_class_name"); it != json.end()) {
    if (!it->is_string()) throw Error(path + ": '_class_name' must be a string, got " + it->dump());
    index.class_name = it->get<std::string>();
  }
  if (const auto it = json.find("boundary_ratio"); it != json.end() && !it->is_null()) {
    if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() <= 0.0 || it->get<double>() >= 1.0)
      throw Error(
          path +
          ": 'boundary_ratio' must be a number in (0, 1) (the share of the timesteps the high-noise expert runs from the top), got " +
          it->dump());
    index.boundary_ratio = it->get<double>();
  }
  if (const auto it = json.find("expand_timesteps"); it != json.end() && !it->is_null()) {
    if (!it->is_boolean()) throw Error(path + ": 'expand_timesteps' must be true or false, got " + it->dump());
    index.expand_timesteps = it->get<bool>();
  }
  return index;
}

void WanT2VPipeline::apply_model_index(const WanModelIndex& index, const std::string& dir) {
  if (!index.expand_timesteps) return;
  const models::WanConfig& c = transformer_->config();
  if (image_to_video())
    throw Error(dir +
                "/model_index.json sets expand_timesteps (Wan2.2 TI2V: the picture replaces latent frame 0), but the transformer "
                "takes " +
                std::to_string(c.in_channels) + " input channels, an image-to-video condition beside the latents");
  // diffusers takes every second latent row and column for the per-token timesteps: the patch must be (1, 2, 2).
  if (c.patch_size != std::array<int64_t, 3>{1, 2, 2})
    throw Error(dir +
                "/model_index.json sets expand_timesteps, whose per-token timesteps assume the transformer's patch_size [1, 2, 2] "
                "(one token per frame and 2x2 latent pixels), got [" +
                std::to_string(c.patch_size[0]) + ", " + std::to_string(c.patch_size[1]) + ", " + std::to_string(c.patch_size[2]) + "]");
  expand_timesteps_ = true;
}

void WanT2VPipeline::add_second_expert(std::unique_ptr<models::WanTransformer3DModel> expert, const std::string& dir,
                                       double boundary_ratio) {
  expert->set_model_index(1);
  check_expert_pair(*transformer_, *expert, dir);
  transformer_2_ = std::move(expert);
  boundary_ratio_ = boundary_ratio;
}

WanT2VPipeline WanT2VPipeline::load(const std::string& dir, DType dtype, const std::string& variant) {
  require_wan_folder(dir);
  const WanModelIndex index = WanModelIndex::load(dir);
  check_experts(dir, index);
  auto vae = std::make_unique<models::AutoencoderKLWan>(models::load_autoencoder_kl_wan(dir + "/vae", DType::f32, variant));
  WanT2VPipeline p(models::WanTransformer3DModel::load(dir + "/transformer", dtype, variant), std::move(vae), wan_scheduler_of(dir));
  if (index.boundary_ratio)
    p.add_second_expert(models::WanTransformer3DModel::load(dir + "/transformer_2", dtype, variant), dir, *index.boundary_ratio);
  p.apply_model_index(index, dir);
  if (p.image_to_video() || p.text_image_to_video()) {
    // The encoder makes the condition; a VAE saved without it can still be inspected and simulated.
    try {
      p.encoder_ =
          std::make_unique<models::AutoencoderKLWanEncoder>(models::load_autoencoder_kl_wan_encoder(dir + "/vae", DType::f32, variant));
    } catch (const Interrupted&) {
      throw;
    } catch (const Error& e) {
      p.encoder_error_ = e.what();
    }
  }
  p.load_image_encoder(dir, /*meta=*/false);
  return p;
}

WanT2VPipeline WanT2VPipeline::load_meta(const std::string& dir, DType dtype) {
  require_wan_folder(dir);
  const WanModelIndex index = WanModelIndex::load(dir);
  check_experts(dir, index);
  const auto meta_transformer = [&](const std::string& folder) {
    auto t = std::make_unique<models::WanTransformer3DModel>(models::WanConfig::load(dir + "/" + folder + "/config.json"));
    models::make_meta_parameters(t->parameters(), dtype);
    return t;
  };
  std::unique_ptr<models::AutoencoderKLWan> vae;
  if (std::filesystem::exists(dir + "/vae/config.json")) {
    vae = std::make_unique<models::AutoencoderKLWan>(models::AutoencoderKLWanConfig::load(dir + "/vae/config.json"));
    models::make_meta_parameters(vae->parameters(), DType::f32);
  }
  WanT2VPipeline p(meta_transformer("transformer"), std::move(vae), wan_scheduler_of(dir));
  if (index.boundary_ratio) p.add_second_expert(meta_transformer("transformer_2"), dir, *index.boundary_ratio);
  p.apply_model_index(index, dir);
  if ((p.image_to_video() || p.text_image_to_video()) && p.vae_) {
    p.encoder_ = std::make_unique<models::AutoencoderKLWanEncoder>(p.vae_->config());
    models::make_meta_parameters(p.encoder_->parameters(), DType::f32);
  }
  p.load_image_encoder(dir, /*meta=*/true);
  return p;
}

void WanT2VPipeline::load_image_encoder(const std::string& dir, bool meta) {
  if (!transformer_->config().has_image_branch()) return;
  const std::string encoder = dir + "/image_encoder", processor = dir + "/image_processor/preprocessor_config.json";
  if (!std::filesystem::is_directory(encoder)) return;  // the error comes when a picture needs it
  if (!std::filesystem::exists(processor))
    throw Error(dir + " has image_encoder/ but no image_processor/preprocessor_config.json (the CLIPImageProcessor settings)");
  image_processor_ = models::ClipImageProcessorConfig::load(processor);
  // f32, as diffusers' Wan I2V examples load it.
  image_encoder_ = meta ? models::ClipVisionModel::with_meta_weights(models::ClipVisionConfig::load(encoder + "/config.json"), DType::f32,
                                                                     ops::default_op_stream())
                        : models::ClipVisionModel::load(encoder, DType::f32, ops::default_op_stream());
  // The processor must make the encoder's image_size x image_size pictures (its crop; checked on a
  // picture of that size, which the resize and crop map as any picture's shorter side).
  const int64_t size = image_encoder_->config().image_size;
  if (!image_processor_.do_center_crop && !(image_processor_.do_resize && image_processor_.shortest_edge == 0))
    throw Error(processor +
                " neither crops nor resizes to a fixed size (do_center_crop false, size by shortest_edge): its pixel_values "
                "would keep each picture's aspect, but " +
                encoder + " takes " + std::to_string(size) + "x" + std::to_string(size) + " pictures");
  const auto [rh, rw] = models::clip_resize_output_size(size, size, image_processor_);
  const int64_t out_h = image_processor_.do_center_crop ? image_processor_.crop_height : rh;
  const int64_t out_w = image_processor_.do_center_crop ? image_processor_.crop_width : rw;
  if (out_h != size || out_w != size)
    throw Error(processor + " makes " + std::to_string(out_w) + "x" + std::to_string(out_h) + " pixel_values, but " + encoder +
                "/config.json's image_size is " + std::to_string(size) + " (the encoder takes image_size x image_size pictures)");
  const int64_t width = image_encoder_->config().hidden_size, image_dim = transformer_->config().image_dim;
  if (width != image_dim)
    throw Error(encoder + ": the image encoder's hidden_size " + std::to_string(width) + " does not match the transformer's image_dim " +
                std::to_string(image_dim));
}

}  // namespace cubevec::pipelines
