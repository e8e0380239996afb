#include "bench/flux_dev_shaped.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "pipelines/flux_t2i.h"
#include "tensor/half.h"
#include "tensor/safetensors.h"

namespace cubevec::bench {

namespace {

namespace fs = std::filesystem;

// Uniform values in [-scale, scale] from a xorshift generator: 12 B of them must take seconds.
struct Random {
  uint64_t state;
  float next(float scale) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (static_cast<float>(state >> 40) / 16777216.0f * 2.0f - 1.0f) * scale;
  }
};

Tensor random_tensor(const Shape& shape, DType dtype, Random& rng, float scale) {
  Tensor t = Tensor::empty(shape, dtype);
  const auto n = static_cast<std::size_t>(t.numel());
  if (dtype == DType::bf16) {
    uint16_t* out = t.mutable_data<uint16_t>();
    for (std::size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(rng.next(scale));
  } else {
    float* out = t.mutable_data<float>();
    for (std::size_t i = 0; i < n; ++i) out[i] = rng.next(scale);
  }
  return t;
}

// Every parameter of `table` as stored at `dtype` (bf16 matrices, f32 vectors), in shards of at
// most `shard_bytes`, as diffusers names them, with the index when there is more than one.
void write_component(const models::ParameterTable& table, DType dtype, const fs::path& dir, std::size_t shard_bytes, uint64_t seed) {
  fs::create_directories(dir);
  std::vector<std::vector<const models::ParameterSpec*>> shards(1);
  std::size_t bytes = 0, total = 0;
  for (const models::ParameterSpec& spec : table.specs()) {
    const bool narrow = dtype == DType::bf16 && spec.shape.size() >= 2 && !spec.keep_f32;
    const std::size_t size = static_cast<std::size_t>(shape_numel(spec.shape)) * (narrow ? 2 : 4);
    if (bytes + size > shard_bytes && !shards.back().empty()) shards.emplace_back(), bytes = 0;
    shards.back().push_back(&spec);
    bytes += size;
    total += size;
  }
  Random rng{seed};
  nlohmann::json weight_map = nlohmann::json::object();
  for (std::size_t s = 0; s < shards.size(); ++s) {
    char name[96];
    if (shards.size() == 1) std::snprintf(name, sizeof name, "diffusion_pytorch_model.safetensors");
    else std::snprintf(name, sizeof name, "diffusion_pytorch_model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    NamedTensors tensors;
    for (const models::ParameterSpec* spec : shards[s]) {
      const bool narrow = dtype == DType::bf16 && spec->shape.size() >= 2 && !spec->keep_f32;
      // Small weights keep 57 random blocks finite; norm scales near 1 as trained ones are.
      const bool norm = spec->shape.size() == 1 && spec->name.find("norm") != std::string::npos;
      Tensor t = random_tensor(spec->shape, narrow ? DType::bf16 : DType::f32, rng, norm ? 1.0f : 0.02f);
      tensors.emplace_back(spec->name, std::move(t));
      weight_map[spec->name] = name;
    }
    write_safetensors((dir / name).string(), tensors);
    std::fprintf(stderr, "\r  %s: shard %zu/%zu written", dir.filename().c_str(), s + 1, shards.size());
  }
  std::fprintf(stderr, "\n");
  if (shards.size() > 1)
    std::ofstream(dir / "diffusion_pytorch_model.safetensors.index.json")
        << nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(1) << "\n";
}

}  // namespace

std::string ensure_flux_dev_shaped(const std::string& dir_text) {
  const fs::path dir(dir_text), embeds = dir / "prompt_embeds.safetensors";
  if (fs::exists(dir / "COMPLETE")) return embeds.string();
  const fs::path configs = fs::path(CUBEVEC_SOURCE_DIR) / "assets/configs/flux1-dev";
  std::fprintf(stderr, "writing a FLUX.1-dev-shaped model with random weights to %s (about 24 GB; once)\n", dir.c_str());
  fs::create_directories(dir);
  for (const char* component : {"transformer", "vae", "scheduler"}) {
    fs::create_directories(dir / component);
    for (const auto& file : fs::directory_iterator(configs / component))
      if (file.path().extension() == ".json")
        fs::copy_file(file.path(), dir / component / file.path().filename(), fs::copy_options::overwrite_existing);
  }
  const pipelines::FluxT2IPipeline meta = pipelines::FluxT2IPipeline::load_meta(configs.string(), DType::bf16);
  write_component(meta.transformer().parameters(), DType::bf16, dir / "transformer", std::size_t{5} << 30, 1);
  if (meta.vae()) write_component(meta.vae()->parameters(), DType::f32, dir / "vae", std::size_t{5} << 30, 2);
  Random rng{3};
  write_safetensors(embeds.string(), {{"prompt_embeds", random_tensor({1, 512, 4096}, DType::f32, rng, 1.0f)},
                                      {"pooled_prompt_embeds", random_tensor({1, 768}, DType::f32, rng, 1.0f)}});
  std::ofstream(dir / "COMPLETE") << "written by cubevec-bench (bench/flux_dev_shaped.cpp)\n";
  return embeds.string();
}

void ensure_flux_width_served(const std::string& dir_text) {
  const fs::path dir(dir_text), source = fs::path(CUBEVEC_SOURCE_DIR);
  if (fs::exists(dir / "COMPLETE")) return;
  std::fprintf(stderr, "writing a FLUX-width served model with random weights to %s (about 2 GB; once)\n", dir.c_str());
  fs::create_directories(dir);
  const auto copy_folder = [&](const fs::path& from, const char* name) {
    fs::create_directories(dir / name);
    for (const auto& file : fs::directory_iterator(from))
      fs::copy_file(file.path(), dir / name / file.path().filename(), fs::copy_options::overwrite_existing);
  };
  copy_folder(source / "assets/configs/flux1-dev/scheduler", "scheduler");
  copy_folder(source / "assets/tinyflux/text_encoder", "text_encoder");
  copy_folder(source / "assets/tinyflux/tokenizer", "tokenizer");
  nlohmann::json transformer = nlohmann::json::parse(std::ifstream(source / "assets/configs/flux1-dev/transformer/config.json"));
  transformer["num_layers"] = 2;
  transformer["num_single_layers"] = 2;
  transformer["joint_attention_dim"] = 64;  // tinyflux's text encoder
  transformer["pooled_projection_dim"] = 64;
  fs::create_directories(dir / "transformer");
  std::ofstream(dir / "transformer/config.json") << transformer.dump(2) << "\n";
  nlohmann::json vae = nlohmann::json::parse(std::ifstream(source / "assets/configs/flux1-dev/vae/config.json"));
  vae["block_out_channels"] = {16, 32, 32, 32};  // four levels: 8x, as FLUX's
  vae["layers_per_block"] = 1;
  vae["norm_num_groups"] = 8;
  vae["mid_block_add_attention"] = false;
  fs::create_directories(dir / "vae");
  std::ofstream(dir / "vae/config.json") << vae.dump(2) << "\n";
  const pipelines::FluxT2IPipeline meta = pipelines::FluxT2IPipeline::load_meta(dir.string(), DType::bf16);
  write_component(meta.transformer().parameters(), DType::bf16, dir / "transformer", std::size_t{5} << 30, 11);
  if (meta.vae()) write_component(meta.vae()->parameters(), DType::f32, dir / "vae", std::size_t{5} << 30, 12);
  std::ofstream(dir / "COMPLETE") << "written by cubevec-bench (bench/flux_dev_shaped.cpp)\n";
}

std::string flux_width_served_folder() {
  const char* model_env = std::getenv("CUBEVEC_FLUX_WIDTH_DIR");
  const std::string folder = model_env && *model_env ? model_env : (fs::temp_directory_path() / "cubevec_flux_width").string();
  ensure_flux_width_served(folder);
  return folder;
}

}  // namespace cubevec::bench
