// models/lora.h's readers and resolver on small files written here: the names of every format map
// to the modules diffusers' conversions map them to (kohya Flux, Wan original, musubi Wan), kohya's
// fused layers split B's rows by the modules' sizes, the final adaLN's halves swap, Wan's diff_b is a
// bias difference and its norm diffs are dropped, and the malformed cases are errors naming the file.
#include "models/lora.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <unistd.h>

#include "common/tensor_testing.h"
#include "models/layers.h"
#include "tensor/safetensors.h"

namespace cubevec {
namespace lora_test {  // named after the file: unity batches never mix two files' helpers

using testing::message_of;
using testing::values;
namespace fs = std::filesystem;

class LoraFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cubevec_lora_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const NamedTensors& tensors) {
    const std::string path = (dir_ / name).string();
    write_safetensors(path, tensors);
    return path;
  }
  static Tensor ramp(const Shape& shape, float step = 1.0f) {
    std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = step * static_cast<float>(i + 1);
    return Tensor::from_vector(v, shape);
  }
  fs::path dir_;
};

std::vector<std::string> modules_of(const models::LoraAdapter& adapter, const std::string& name) {
  for (const models::LoraLayer& l : adapter.layers)
    if (l.name == name) return l.modules;
  return {"(no layer " + name + ")"};
}

TEST_F(LoraFiles, EveryFormatsNamesMapAsDiffusersConvertsThem) {
  const Tensor a = ramp({2, 4}), b = ramp({6, 2});
  const models::LoraAdapter kohya =
      models::read_lora(write("kohya.safetensors", {{"lora_unet_double_blocks_3_img_attn_qkv.lora_down.weight", a},
                                                    {"lora_unet_double_blocks_3_img_attn_qkv.lora_up.weight", b},
                                                    {"lora_unet_single_blocks_7_linear1.lora_down.weight", a},
                                                    {"lora_unet_single_blocks_7_linear1.lora_up.weight", b},
                                                    {"lora_unet_time_in_out_layer.lora_down.weight", a},
                                                    {"lora_unet_time_in_out_layer.lora_up.weight", b},
                                                    {"lora_te1_text_model_q.lora_down.weight", a},
                                                    {"lora_te1_text_model_q.lora_up.weight", b}}));
  EXPECT_EQ(kohya.format, "kohya-flux");
  EXPECT_EQ(
      modules_of(kohya, "lora_unet_double_blocks_3_img_attn_qkv"),
      (std::vector<std::string>{"transformer_blocks.3.attn.to_q", "transformer_blocks.3.attn.to_k", "transformer_blocks.3.attn.to_v"}));
  EXPECT_EQ(modules_of(kohya, "lora_unet_single_blocks_7_linear1"),
            (std::vector<std::string>{"single_transformer_blocks.7.attn.to_q", "single_transformer_blocks.7.attn.to_k",
                                      "single_transformer_blocks.7.attn.to_v", "single_transformer_blocks.7.proj_mlp"}));
  EXPECT_EQ(modules_of(kohya, "lora_unet_time_in_out_layer"), (std::vector<std::string>{"time_text_embed.timestep_embedder.linear_2"}));
  EXPECT_EQ(modules_of(kohya, "lora_te1_text_model_q"), (std::vector<std::string>{"lora_te1_text_model_q"}));  // listed as unmatched
  const models::LoraAdapter musubi =
      models::read_lora(write("musubi.safetensors", {{"lora_unet_blocks_4_cross_attn_k_img.lora_down.weight", a},
                                                     {"lora_unet_blocks_4_cross_attn_k_img.lora_up.weight", b},
                                                     {"lora_unet_blocks_0_ffn_2.lora_down.weight", a},
                                                     {"lora_unet_blocks_0_ffn_2.lora_up.weight", b},
                                                     {"lora_unet_blocks_0_ffn_2.alpha", ramp({1})}}));
  EXPECT_EQ(musubi.format, "musubi-wan");
  EXPECT_EQ(modules_of(musubi, "lora_unet_blocks_4_cross_attn_k_img"), (std::vector<std::string>{"blocks.4.attn2.add_k_proj"}));
  EXPECT_EQ(modules_of(musubi, "lora_unet_blocks_0_ffn_2"), (std::vector<std::string>{"blocks.0.ffn.net.2"}));
  const models::LoraAdapter wan =
      models::read_lora(write("wan.safetensors", {{"diffusion_model.blocks.2.self_attn.o.lora_down.weight", a},
                                                  {"diffusion_model.blocks.2.self_attn.o.lora_up.weight", b},
                                                  {"diffusion_model.img_emb.proj.3.lora_A.weight", a},
                                                  {"diffusion_model.img_emb.proj.3.lora_B.weight", b},
                                                  {"diffusion_model.head.head.diff_b", ramp({6})},
                                                  {"diffusion_model.blocks.0.norm3.diff_b", ramp({6})},
                                                  {"diffusion_model.blocks.1.self_attn.q.diff", ramp({6, 4})}}));
  EXPECT_EQ(wan.format, "wan");
  EXPECT_EQ(modules_of(wan, "blocks.2.self_attn.o"), (std::vector<std::string>{"blocks.2.attn1.to_out.0"}));
  EXPECT_EQ(modules_of(wan, "img_emb.proj.3"), (std::vector<std::string>{"condition_embedder.image_embedder.ff.net.2"}));
  EXPECT_EQ(modules_of(wan, "head.head"), (std::vector<std::string>{"proj_out"}));  // a bias difference alone
  // A whole weight difference is not applied: listed as unmatched under a name that says why.
  EXPECT_EQ(modules_of(wan, "blocks.1.self_attn.q.diff (a whole weight difference, not applied)").size(), 1u);
  EXPECT_EQ(modules_of(wan, "blocks.0.norm3").front(), "(no layer blocks.0.norm3)");  // dropped
  // ... but only after the usual checks.
  const std::string nan_norm = message_of([&] {
    models::read_lora(
        write("nan_norm.safetensors", {{"diffusion_model.blocks.0.norm3.diff", Tensor::from_vector(std::vector<float>{NAN, 0}, {2})}}));
  });
  EXPECT_NE(nan_norm.find("non-finite"), std::string::npos) << nan_norm;
  const std::string twice = message_of([&] {
    models::read_lora(write("twice.safetensors",
                            {{"diffusion_model.blocks.0.ffn.0.lora_A.weight", a}, {"diffusion_model.blocks.0.ffn.0.lora_down.weight", a}}));
  });
  EXPECT_NE(twice.find("under two names"), std::string::npos) << twice;
  // Two formats in one file.
  const std::string mixed = message_of([&] {
    models::read_lora(write("mixed.safetensors", {{"lora_unet_img_in.lora_down.weight", a}, {"transformer.x_embedder.lora_A.weight", a}}));
  });
  EXPECT_NE(mixed.find("one file holds one LoRA format"), std::string::npos) << mixed;
}

TEST_F(LoraFiles, FusedLayersSplitAndTheFinalAdaLnSwaps) {
  models::ParameterTable table;
  models::Linear q, k, v, mlp, norm_out;
  q.declare(table, "single_transformer_blocks.0.attn.to_q", 4, 2);
  k.declare(table, "single_transformer_blocks.0.attn.to_k", 4, 2);
  v.declare(table, "single_transformer_blocks.0.attn.to_v", 4, 2);
  mlp.declare(table, "single_transformer_blocks.0.proj_mlp", 4, 3);
  norm_out.declare(table, "norm_out.linear", 4, 4);
  models::Linear x_embedder;  // makes the table Flux-like for the kohya file
  x_embedder.declare(table, "x_embedder", 4, 4);
  const Tensor a = ramp({2, 4}), b9 = ramp({9, 2}), b4 = ramp({4, 2});
  const models::LoraAdapter adapter =
      models::read_lora(write("kohya.safetensors", {{"lora_unet_single_blocks_0_linear1.lora_down.weight", a},
                                                    {"lora_unet_single_blocks_0_linear1.lora_up.weight", b9},
                                                    {"lora_unet_single_blocks_0_linear1.alpha", ramp({1}, 4.0f)},
                                                    {"lora_unet_final_layer_adaLN_modulation_1.lora_down.weight", a},
                                                    {"lora_unet_final_layer_adaLN_modulation_1.lora_up.weight", b4}}));
  const std::vector<models::LoraDelta> deltas = models::resolve_lora(table, adapter, 0.5);
  ASSERT_EQ(deltas.size(), 5u);
  const auto delta = [&](const std::string& module) {
    for (const models::LoraDelta& d : deltas)
      if (d.module == module) return d;
    ADD_FAILURE() << "no delta for " << module;
    return deltas.front();
  };
  const std::vector<double> all = values(b9), swapped = values(delta("norm_out.linear").up);
  int64_t row = 0;
  const char* parts_in_order[] = {"single_transformer_blocks.0.attn.to_q", "single_transformer_blocks.0.attn.to_k",
                                  "single_transformer_blocks.0.attn.to_v", "single_transformer_blocks.0.proj_mlp"};
  for (const char* module : parts_in_order) {  // linear1: B's rows 0-1 to q, 2-3 to k, 4-5 to v, 6-8 to the MLP; A shared
    const models::LoraDelta d = delta(module);
    const std::vector<double> part = values(d.up);
    EXPECT_EQ(part, std::vector<double>(all.begin() + row * 2, all.begin() + row * 2 + static_cast<int64_t>(part.size()))) << module;
    row += static_cast<int64_t>(part.size()) / 2;
    EXPECT_EQ(values(d.down), values(a));
    EXPECT_DOUBLE_EQ(d.factor, 0.5 * 4.0 / 2.0);  // scale alpha / rank
  }
  // BFL's (shift, scale) rows as diffusers' (scale, shift): halves swapped.
  EXPECT_EQ(swapped, (std::vector<double>{5, 6, 7, 8, 1, 2, 3, 4}));
  // A fused layer whose parts do not add up to B's rows names them.
  const models::LoraAdapter short_b =
      models::read_lora(write("short.safetensors", {{"lora_unet_single_blocks_0_linear1.lora_down.weight", a},
                                                    {"lora_unet_single_blocks_0_linear1.lora_up.weight", b4}}));
  const std::string parts = message_of([&] { models::resolve_lora(table, short_b, 1.0); });
  EXPECT_NE(parts.find("is [2, 4] + [2, 4] + [2, 4] + [3, 4], but its LoRA makes [4, 4]"), std::string::npos) << parts;
  // A file of the other family's names is refused by name, though proj_out exists in both.
  const models::LoraAdapter wan_head = models::read_lora(
      write("head.safetensors", {{"diffusion_model.head.head.lora_A.weight", a}, {"diffusion_model.head.head.lora_B.weight", b4}}));
  EXPECT_NE(message_of([&] { models::resolve_lora(table, wan_head, 1.0); }).find("is for a Wan transformer"), std::string::npos);
  // A bias difference on a layer without a bias.
  models::Linear no_bias, time_proj;
  no_bias.declare(table, "proj_out", 4, 6, /*has_bias=*/false);
  time_proj.declare(table, "condition_embedder.time_proj", 4, 4);  // makes the table Wan-like for the Wan file
  const models::LoraAdapter diff = models::read_lora(write("diff.safetensors", {{"diffusion_model.head.head.diff_b", ramp({6})}}));
  const std::string bias = message_of([&] { models::resolve_lora(table, diff, 1.0); });
  EXPECT_NE(bias.find("'proj_out' has no bias"), std::string::npos) << bias;
}

}  // namespace lora_test
}  // namespace cubevec
